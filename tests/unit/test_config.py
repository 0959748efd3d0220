"""OFFRAMP_* settings: parsing, clear errors, and how the supervisor resolves ORT spinning."""

import pytest

from services.common import config as config_mod
from services.launcher.supervisor import Deployment, Supervisor


def test_ort_spin_defaults_to_off_and_reaches_child_services(monkeypatch):
    monkeypatch.delenv("OFFRAMP_ORT_SPIN", raising=False)
    cfg = config_mod.load()
    assert cfg.ort_spin == "off"  # open-loop serving: spinning never helped (runtime.spin_for)
    assert Supervisor(cfg, Deployment(("m",))).ort_spin() == "off"
    monkeypatch.setenv("OFFRAMP_ORT_SPIN", "ON")
    assert config_mod.load().as_env()["OFFRAMP_ORT_SPIN"] == "on"


def test_bad_settings_are_config_errors_that_name_the_variable(monkeypatch):
    monkeypatch.setenv("OFFRAMP_ORT_SPIN", "sometimes")
    with pytest.raises(config_mod.ConfigError, match="OFFRAMP_ORT_SPIN"):
        config_mod.load()
    monkeypatch.setenv("OFFRAMP_ORT_SPIN", "auto")
    monkeypatch.setenv("OFFRAMP_MAX_BATCH", "many")
    with pytest.raises(config_mod.ConfigError, match="many"):
        config_mod.load()


def test_variant_headroom_defaults_reaches_children_and_refuses_below_one(monkeypatch):
    monkeypatch.delenv("OFFRAMP_VARIANT_HEADROOM", raising=False)
    assert config_mod.load().variant_headroom == 1.5
    monkeypatch.setenv("OFFRAMP_VARIANT_HEADROOM", "2")
    assert config_mod.load().as_env()["OFFRAMP_VARIANT_HEADROOM"] == "2.0"
    monkeypatch.setenv("OFFRAMP_VARIANT_HEADROOM", "0.9")
    with pytest.raises(config_mod.ConfigError, match="OFFRAMP_VARIANT_HEADROOM"):
        config_mod.load()


@pytest.mark.parametrize(("setting", "deployment", "workers", "want"), [
    ("auto", Deployment(("m",)), 1, "on"),
    ("auto", Deployment(("m",), cuts={"m": [4]}), 2, "off"),
    ("auto", Deployment(("m",), replicas=2), 2, "off"),
    ("auto", Deployment(("m", "n")), 2, "off"),
    ("on", Deployment(("m",), cuts={"m": [4, 8]}, replicas=2), 6, "on"),
    ("off", Deployment(("m",)), 1, "off"),
])
def test_supervisor_spins_workers_only_when_one_runs_on_the_host(monkeypatch, setting, deployment,
                                                                 workers, want):
    monkeypatch.setenv("OFFRAMP_ORT_SPIN", setting)
    sup = Supervisor(config_mod.load(), deployment)
    assert sup.workers() == workers
    assert sup.ort_spin() == want
