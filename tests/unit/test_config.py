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


@pytest.mark.parametrize(("name", "value"), [
    ("OFFRAMP_MAX_BATCH", "0"), ("OFFRAMP_MAX_BATCH", "-3"), ("OFFRAMP_QUEUE_LIMIT", "0"),
    ("OFFRAMP_WORKER_CREDIT", "0"), ("OFFRAMP_MONITOR_WINDOW", "x"),
    ("OFFRAMP_REQUEST_TIMEOUT_S", "0"), ("OFFRAMP_HEARTBEAT_MS", "-1"),
    ("OFFRAMP_DEFAULT_SLO_MS", "soon"), ("OFFRAMP_BATCH_TIMEOUT_MS", "-2"),
    ("OFFRAMP_DEVICE", "gpu"), ("OFFRAMP_LOG_LEVEL", "LOUD"), ("OFFRAMP_ORT_THREADS", "-1"),
    ("OFFRAMP_ACCURACY_LOSS", "-1"), ("OFFRAMP_ACCURACY_LOSS", "1"), ("OFFRAMP_RAMP_BUDGET", "-0.1"),
    ("OFFRAMP_NATS_PROCS", "two"),
])
def test_values_services_would_crash_on_are_refused_by_name(monkeypatch, name, value):
    # each of these once passed the CLI and crash-looped a service under `offramp up`
    monkeypatch.setenv(name, value)
    with pytest.raises(config_mod.ConfigError, match=name):
        config_mod.load()


def test_device_and_log_level_take_any_case(monkeypatch):
    monkeypatch.setenv("OFFRAMP_DEVICE", "CPU")
    monkeypatch.setenv("OFFRAMP_LOG_LEVEL", "debug")
    cfg = config_mod.load()
    assert (cfg.device, cfg.log_level) == ("cpu", "DEBUG")
