"""The compiled threshold climb (climb.c): built with the system C compiler, the same decisions
as the Python climb to the last bit, and the Python climb where nothing compiles."""

from __future__ import annotations

import numpy as np

from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.tuner.thresholds import (
    tune,
)
from tests.unit.test_tuner_thresholds import synthetic


def _random_case(rng: np.random.Generator) -> tuple[ExitWindow, LatencyProfile, dict]:
    n_sites = int(rng.integers(1, 8))
    r, n = int(rng.integers(0, n_sites + 1)), int(rng.integers(1, 300))
    ids = tuple(sorted(rng.choice(n_sites, r, replace=False).tolist()))
    final = rng.integers(0, 4, n)
    pred = np.where(rng.random((r, n)) < rng.uniform(0, 0.5), rng.integers(0, 4, (r, n)), final)
    score = rng.random((r, n))
    score = [score, np.round(score * 10) / 10, score ** 3][int(rng.integers(3))]  # ties, skew
    prefix = np.sort(rng.uniform(0, 10, n_sites))
    profile = LatencyProfile.build([*prefix, prefix[-1] + rng.uniform(0.1, 5)],
                                   rng.uniform(0, 0.5, n_sites))
    step = float(rng.choice([0.08, 0.1, 0.03]))
    kw = {"constraint": float(rng.choice([0.0, 0.01, 0.05, 0.2])),
          "start": None if rng.random() < 0.5 else rng.uniform(0, 1.2, r).tolist(),
          "max_threshold": float(rng.choice([1.0, 0.5, 0.77])), "initial_step": step,
          "floor": min(float(rng.choice([0.01, 0.005])), step)}
    if rng.random() < 0.1:
        kw["max_rounds"] = int(rng.integers(0, 5))
    return ExitWindow(ids, pred, score, final), profile, kw


def test_the_compiled_climb_takes_the_python_climbs_every_decision():
    """climb.c must be the same algorithm: identical thresholds, moves (with their gains),
    steps, rounds and evaluation, to the last bit, on random windows with ties, violating
    starts, caps and round limits, and on the structured synthetic windows."""
    from services.tuner import climb_native

    assert climb_native.load() is not None, climb_native.failure()
    rng = np.random.default_rng(11)
    cases = [_random_case(rng) for _ in range(600)]
    cases += [(*synthetic(seed, n=n), {"constraint": c}) for seed in range(6)
              for n in (16, 128, 512) for c in (0.01, 0.05)]
    moved = 0
    for window, profile, kw in cases:
        compiled = tune(window, profile, climb=climb_native.compiled_climb, **kw)
        assert compiled == tune(window, profile, **kw), (window.ramp_ids, kw)
        moved += bool(compiled.moves)
    assert moved > len(cases) // 2  # the comparison covered real climbs, not empty ones


def test_the_tuner_climbs_in_python_where_nothing_compiles(tmp_path, monkeypatch):
    from services.common import native
    from services.tuner import climb_native

    monkeypatch.setattr(native, "COMPILERS", ("no-such-cc",))
    monkeypatch.setattr(climb_native, "_lib", None)
    monkeypatch.setattr(climb_native, "_failure", None)
    assert climb_native.load(tmp_path) is None
    assert "no C compiler" in climb_native.failure()
    assert not climb_native.enabled()
    assert climb_native.best_climb() is None  # the tuner passes no engine: the Python climb
    window, profile = synthetic(3)
    assert tune(window, profile, climb=climb_native.best_climb()).moves
    monkeypatch.setattr(climb_native, "_failure", None)
    monkeypatch.setattr(native, "COMPILERS", ("cc", "gcc", "clang"))
    assert not climb_native.enabled(wanted=False)  # OFFRAMP_TUNER_NATIVE=0
