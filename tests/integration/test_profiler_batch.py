"""The profiler's batch-profile role against a real store: windows of request history in,
observed and forecast survival per ramp out, drift marked, resumable after a restart."""

from __future__ import annotations

import logging

import pytest

from services.profiler.service import BatchProfiler, utc
from services.store import Store

T0 = 1_800_000_000.0  # a window boundary (a multiple of 10 s)
W = 10.0
LOG = logging.getLogger("test")


SCALE = 10  # requests per unit of ``exits``: a window of 10 units holds 100 samples, enough
           # for the profiler to judge the forecast made from it (MIN_FORECAST_SAMPLES)


def _requests(store: Store, start: float, exits: dict[int, int], tag: str,
              status: str = "ok", version: int = 1, offset_s: float = 0.5,
              scale: int = SCALE) -> None:
    rows, k = [], 0
    for exit_, n in exits.items():
        for _ in range(n * scale):
            rows.append({"request_id": f"{tag}-{k}", "model": "m", "received_at":
                         utc(start + offset_s + k * 0.001), "status": status, "exit": exit_,
                         "early": exit_ >= 0, "config_version": version})
            k += 1
    store.add_requests(rows)


@pytest.fixture
def served(store: Store) -> Store:
    store.save_exit_config("m", {0: 0.5, 3: 0.5}, [0, 3], "latency", "test")
    _requests(store, T0, {0: 2, 3: 3, -1: 5}, "a")
    _requests(store, T0 + W, {0: 2, 3: 3, -1: 5}, "b")
    _requests(store, T0 + W, {0: 9}, "e", status="deadline_exceeded")  # not answered: ignored
    _requests(store, T0 + 2 * W, {0: 8, -1: 2}, "c")  # most now leave at ramp 0
    return store


def test_windows_are_profiled_forecast_and_judged_for_drift(served: Store) -> None:
    bp = BatchProfiler(served, LOG, W, grace_s=5.0)
    assert bp.poll_model("m", T0 + 3 * W + 5.0) == 3
    rows = served.batch_profiles("m")
    by_window: dict[float, dict[int, dict]] = {}
    for r in rows:
        by_window.setdefault(r["window_start"], {})[r["ramp"]] = r
    w0, w1, w2, w3 = (by_window[utc(T0 + k * W)] for k in range(4))
    assert {r: w0[r]["observed"] for r in w0} == pytest.approx({0: 0.8, 3: 0.5})
    assert w0[0]["forecast"] is None and w0[0]["samples"] == 10 * SCALE
    assert w1[3]["forecast"] == pytest.approx(0.5) and w1[3]["error"] == pytest.approx(0.0)
    assert w1[0]["drifted"] is False and w1[0]["samples"] == 10 * SCALE  # misses: not in
    assert w2[0]["observed"] == pytest.approx(0.2) and w2[3]["observed"] == pytest.approx(0.2)
    assert w2[0]["drifted"] is True and w2[0]["error"] == pytest.approx(0.6)
    assert w3[0]["observed"] is None and w3[0]["forecast"] is not None  # next window: forecast
    assert all(r["config_version"] == 1 for r in rows)


def test_a_window_is_left_until_its_grace_has_passed(served: Store) -> None:
    bp = BatchProfiler(served, LOG, W, grace_s=5.0)
    assert bp.poll_model("m", T0 + 3 * W + 4.0) == 2  # window 2 ended 4 s ago: not yet
    assert bp.poll_model("m", T0 + 3 * W + 5.0) == 1


def test_a_restarted_profiler_resumes_after_the_newest_window(served: Store) -> None:
    BatchProfiler(served, LOG, W).poll_model("m", T0 + 3 * W + 5.0)
    before = served.batch_profiles("m")
    again = BatchProfiler(served, LOG, W)
    assert again.poll_model("m", T0 + 3 * W + 5.0) == 0
    assert served.batch_profiles("m") == before
    _requests(served, T0 + 3 * W, {3: 5, -1: 5}, "d")
    assert again.poll_model("m", T0 + 4 * W + 5.0) == 1


def test_models_without_ramps_or_requests_store_nothing(store: Store) -> None:
    store.save_exit_config("m", {}, [], "vanilla", "test")
    _requests(store, T0, {-1: 10}, "v")
    bp = BatchProfiler(store, LOG, W)
    assert bp.poll_model("m", T0 + W + 5.0) == 0
    assert bp.poll_model("idle", T0 + W + 5.0) == 0
    assert store.batch_profiles("m") == []


def test_under_a_plan_only_the_ramps_it_runs_are_tracked(served: Store) -> None:
    served.save_plan("m", "test", True, 1, 1, 1, {"stages": [{"active_ramps": [3]}]}, {})
    BatchProfiler(served, LOG, W).poll_model("m", T0 + W + 5.0)
    assert {r["ramp"] for r in served.batch_profiles("m")} == {0, 3}  # 0: some exited there
    _requests(served, T0 + 5 * W, {3: 5, -1: 5}, "f")
    BatchProfiler(served, LOG, W).poll_model("m", T0 + 6 * W + 5.0)
    assert {r["ramp"] for r in served.batch_profiles("m", since=utc(T0 + 5 * W))} == {3}


def test_a_new_exit_config_starts_a_new_series_not_a_drift(served: Store) -> None:
    served.save_exit_config("m", {0: 0.9, 3: 0.5}, [0, 3], "compute", "new thresholds")
    _requests(served, T0 + 3 * W, {0: 9, -1: 1}, "n", version=2)  # survival moved by design
    BatchProfiler(served, LOG, W).poll_model("m", T0 + 4 * W + 5.0)
    rows = {(r["window_start"], r["ramp"]): r for r in served.batch_profiles("m")}
    w2, w3 = rows[(utc(T0 + 2 * W), 0)], rows[(utc(T0 + 3 * W), 0)]
    assert w2["drifted"] is True        # same config as the windows before: a real drift
    assert w3["drifted"] is None        # the forecast was made under config 1: not judged
    assert w3["config_version"] == 2 and w3["observed"] == pytest.approx(0.1)
    nxt = rows[(utc(T0 + 4 * W), 0)]
    assert nxt["forecast"] == pytest.approx(0.1)  # config 2's own history: one window


def test_a_window_a_new_config_began_in_counts_the_new_configs_requests(served: Store) -> None:
    served.save_exit_config("m", {0: 0.9, 3: 0.5}, [0, 3], "compute", "new thresholds")
    _requests(served, T0 + 3 * W, {3: 10}, "old")                        # config 1's tail
    _requests(served, T0 + 3 * W, {0: 9, -1: 1}, "new", version=2, offset_s=5.0)
    _requests(served, T0 + 4 * W, {0: 9, -1: 1}, "next", version=2)
    BatchProfiler(served, LOG, W).poll_model("m", T0 + 5 * W + 5.0)
    rows = {(r["window_start"], r["ramp"]): r for r in served.batch_profiles("m")}
    mixed, nxt = rows[(utc(T0 + 3 * W), 0)], rows[(utc(T0 + 4 * W), 0)]
    assert mixed["config_version"] == 2 and mixed["samples"] == 10 * SCALE
    assert mixed["observed"] == pytest.approx(0.1)  # not 0.55 with config 1's tail in it
    assert mixed["drifted"] is None                  # its forecast was config 1's
    assert nxt["forecast"] == pytest.approx(0.1)     # config 2's series from its first part
    assert nxt["drifted"] is False                   # the same config: no drift


def test_a_forecast_from_too_few_samples_is_not_judged(store: Store) -> None:
    store.save_exit_config("m", {0: 0.5, 3: 0.5}, [0, 3], "latency", "test")
    _requests(store, T0, {0: 1, -1: 1}, "few", scale=10)           # 20 samples
    _requests(store, T0 + W, {0: 80, -1: 20}, "many", scale=1)     # 100 samples, 0.8 -> 0.2
    _requests(store, T0 + 2 * W, {0: 20, -1: 80}, "back", scale=1)
    BatchProfiler(store, LOG, W).poll_model("m", T0 + 3 * W + 5.0)
    rows = {(r["window_start"], r["ramp"]): r for r in store.batch_profiles("m")}
    assert rows[(utc(T0 + W), 0)]["drifted"] is None   # forecast from 20 samples: noise
    assert rows[(utc(T0 + 2 * W), 0)]["drifted"] is True  # from 100: a real move
