"""A restarted tuner (services.tuner.service.Tuner.load) resumes its saved controller, but
with the model's current serving profile and the configured ramp budget."""

from __future__ import annotations

import logging

import pytest

from services.common import config as config_mod
from services.exits.latency_profile import LatencyProfile
from services.runtime.manifest import Manifest
from services.store.migrate import upgrade
from services.store.repository import Store
from services.tuner.controller import ExitController
from services.tuner.service import Tuner

MODEL = "tiny"


@pytest.fixture()
def tuner(models_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OFFRAMP_MODELS_DIR", str(models_dir))
    monkeypatch.setenv("OFFRAMP_RAMP_BUDGET", "0.3")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    store = Store(url)
    yield Tuner(None, config_mod.load(), store, logging.getLogger("test"))
    store.close()


def _save(tuner: Tuner, profile: LatencyProfile, version: int) -> None:
    ctrl = ExitController(profile, [0, 1], [0.1, 0.2], budget=0.02, version=version)
    tuner.store.save_tuner_state(MODEL, ctrl.to_dict(), version)


def test_resume_refreshes_profile_and_budget(tuner, models_dir):
    manifest = Manifest.load(models_dir / MODEL)
    row = tuner.store.save_exit_config(MODEL, {0: 0.1, 1: 0.2}, [0, 1], "latency", "test")
    current = LatencyProfile.from_manifest(manifest)
    stale = LatencyProfile.build(current.prefix_ms * 3, current.ramp_cost_ms * 5)
    _save(tuner, stale, row.version)
    got = tuner.load(MODEL).controller
    assert got.active == (0, 1) and got.thresholds == (0.1, 0.2)  # resumed, not reset
    assert list(got.profile.ramp_cost_ms) == list(current.ramp_cost_ms)
    assert got.budget == 0.3


def test_resume_with_other_sites_starts_from_the_config_in_force(tuner, models_dir):
    manifest = Manifest.load(models_dir / MODEL)
    row = tuner.store.save_exit_config(MODEL, {0: 0.1, 1: 0.2}, [0, 1], "latency", "test")
    more = LatencyProfile.from_manifest(manifest)
    wider = LatencyProfile.build([*more.prefix_ms[:-1], more.prefix_ms[-1], more.prefix_ms[-1]],
                                 [*more.ramp_cost_ms, 0.001])
    _save(tuner, wider, row.version)
    got = tuner.load(MODEL).controller
    assert got.profile.n_sites == len(manifest.ramps)
    assert got.active == (0, 1) and got.thresholds == (0.1, 0.2) and got.seen == 0


def test_resume_keeps_the_feedback_and_takes_the_modes_knobs_as_configured_now(
        tuner, models_dir):
    """A state saved under other knobs (here: a compute-mode controller tuning the point
    estimate on 512 samples) resumes its feedback and config under the mode's knobs."""
    from services.exits.exit_window import ExitWindow
    from services.tuner.controller import COMPUTE_TUNE_WINDOW

    manifest = Manifest.load(models_dir / MODEL)
    row = tuner.store.save_exit_config(MODEL, {0: 0.1, 1: 0.2}, [0, 1], "compute", "test")
    old = ExitController(LatencyProfile.from_manifest(manifest), [0, 1], [0.1, 0.2],
                         tune_window=512, sampled_feedback=False, version=row.version,
                         slack_windows=None)
    old.observe(ExitWindow.build((0, 1), [[1] * 8, [1] * 8], [[0.5] * 8] * 2, [1] * 8))
    tuner.store.save_tuner_state(MODEL, old.to_dict(), row.version)
    got = tuner.load(MODEL).controller
    assert got.seen == 8 and got.thresholds == (0.1, 0.2)  # resumed, not reset
    assert got.tune_window == COMPUTE_TUNE_WINDOW and got.sampled_feedback
    assert got.slack_windows is not None  # the knob as configured, not as saved


def test_in_compute_mode_the_tuner_tunes_thresholds_and_leaves_the_active_set_to_plans(
        tuner, models_dir):
    from services.tuner.controller import COMPUTE_TUNE_WINDOW, NEVER

    tuner.store.save_exit_config(MODEL, {0: 0.1, 1: 0.2}, [0, 1], "compute", "test")
    got = tuner.load(MODEL)
    assert got.mode == "compute"
    assert got.controller.adjust_every == NEVER  # no ramp-adjustment rounds
    # the feedback it keeps is its tune window: no unbounded memory for adjustment rounds
    assert got.controller.capacity == COMPUTE_TUNE_WINDOW
    assert got.controller.sampled_feedback  # feedback is a sample: tune and alert on its interval
    tuner.store.save_exit_config(MODEL, {0: 0.1, 1: 0.2}, [0, 1], "latency", "test")
    back = tuner.load(MODEL)
    assert back.mode == "latency" and back.controller.adjust_every < NEVER
    assert not back.controller.sampled_feedback


def test_in_compute_mode_the_tuner_tunes_the_ramps_the_plan_runs_and_keeps_the_rest(
        tuner, models_dir):
    import asyncio
    from types import SimpleNamespace

    published = []

    class Bus:
        async def publish(self, subject, data):
            published.append(subject)

    tuner.nc = Bus()
    tuner.store.save_exit_config(MODEL, {0: 0.1, 1: 0.2, 2: 0.3}, [0, 1, 2], "compute", "t")
    mt = tuner.load(MODEL)
    tuner._follow_plan(mt, [2, 0])  # the plan switched ramp 1 off
    assert mt.controller.active == (0, 2) and mt.controller.thresholds == (0.1, 0.3)
    assert mt.controller.sampled_feedback and mt.controller.adjust_every > 10**9
    d = SimpleNamespace(kind="tune", utilities=[], changed=True, active=(0, 2),
                        thresholds=(0.05, 0.25), trigger="alert", action="tune", reason="test")
    asyncio.run(tuner._deploy(mt, d, 0.1))
    row = tuner.store.latest_exit_config(MODEL)
    assert row.mode == "compute" and row.active == [0, 1, 2]  # the plan's choice, not ours
    assert row.thresholds == {0: 0.05, 1: 0.2, 2: 0.25}  # ramp 1 keeps its threshold
    assert published == [f"offramp.config.{MODEL}"]
    tuner._follow_plan(mt, [0, 1, 2])  # a later plan runs all three again
    assert mt.controller.active == (0, 1, 2) and mt.controller.thresholds == (0.05, 0.2, 0.25)
