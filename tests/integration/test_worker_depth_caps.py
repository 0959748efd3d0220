"""Depth caps in the split worker on the tiny model (exit depth as a variant): a capped
batch answers every sample at its cap or earlier and stops there, the variant rides the
answers and the forwarded batches, capped answers feed no telemetry, and a malformed cap
is a bad request."""

from __future__ import annotations

import numpy as np
import pytest

from schemas import errors
from schemas.errors import ServingError
from schemas.messages import Batch
from services.exits import depth_caps
from tests.integration.test_worker_compute_mode import (
    MODEL,
    _config,
    _forwarded,
    _inputs,
    _reference,
    _results,
    _run,
    _worker,
    in_loop,
)


def _capped(n: int, variant: str, seed: int = 4) -> Batch:
    return Batch("c1", MODEL, 0, "router.r", [f"c1-{i}" for i in range(n)], 1,
                 {"x": _inputs(n, seed)}, variant=variant)


def _answers(sent) -> dict[str, tuple[int, int, str | None]]:
    return {i: (int(r.labels[k]), int(r.exits[k]), r.variant) for r in _results(sent)
            for k, i in enumerate(r.ids)}


@in_loop
def test_a_capped_batch_answers_at_its_cap_and_stops(models_dir) -> None:
    sent: list = []
    w = _worker(models_dir, 0, [], _config(0.0), 1.0, sent)  # every sample selected
    batch = _capped(8, "depth<=1")
    _run(w, [batch])
    ramp_pred, _final = _reference(models_dir, batch.inputs["x"])
    got = _answers(sent)
    assert len(got) == 8
    for i in range(8):  # nothing passes a threshold of 0: all answer at the cap's ramp
        assert got[f"c1-{i}"] == (int(ramp_pred[1][i]), 1, "depth<=1")
    assert _forwarded(sent) == [] and not w.shadow_work
    assert w.telemetry.samples == 0  # capped answers are not the exit config's feedback


@in_loop
def test_earlier_confident_exits_keep_their_answers_under_a_cap(models_dir) -> None:
    x = _inputs(32, seed=3)
    ramp_pred, _final = _reference(models_dir, x)
    for threshold in (0.3, 0.6, 0.9):
        sent: list = []
        w = _worker(models_dir, 0, [], _config(threshold), 0.0, sent)
        batch = Batch("c1", MODEL, 0, "router.r", [f"c1-{i}" for i in range(32)], 1,
                      {"x": x}, variant="depth<=1")
        _run(w, [batch])
        got = _answers(sent)
        assert len(got) == 32
        exits = np.array([got[f"c1-{i}"][1] for i in range(32)])
        assert set(exits.tolist()) <= {0, 1}
        want = depth_caps.cap_answers([0, 1], ramp_pred[:2], exits, 1)
        assert [got[f"c1-{i}"][0] for i in range(32)] == want.tolist()


@in_loop
def test_the_final_cap_serves_the_model_as_configured(models_dir) -> None:
    x = _inputs(16, seed=5)
    plain: list = []
    capped: list = []
    _run(_worker(models_dir, 0, [], _config(0.6), 0.0, plain),
         [Batch("c1", MODEL, 0, "router.r", [f"c1-{i}" for i in range(16)], 1, {"x": x})])
    _run(_worker(models_dir, 0, [], _config(0.6), 0.0, capped),
         [Batch("c1", MODEL, 0, "router.r", [f"c1-{i}" for i in range(16)], 1, {"x": x},
                variant=depth_caps.FINAL)])
    assert {k: v[:2] for k, v in _answers(plain).items()} == {
        k: v[:2] for k, v in _answers(capped).items()}


@in_loop
def test_a_cap_in_a_later_stage_travels_with_the_forwarded_batch(models_dir) -> None:
    sent: list = []
    w0 = _worker(models_dir, 0, [2], _config(0.0), 0.0, sent)
    _run(w0, [_capped(6, "depth<=2")])
    (nxt,) = _forwarded(sent)
    assert nxt.variant == "depth<=2"
    later: list = []
    _run(_worker(models_dir, 1, [2], _config(0.0), 0.0, later), [nxt])
    got = _answers(later)
    assert len(got) == 6 and {e for _l, e, _v in got.values()} == {2}


@in_loop
def test_latency_mode_answers_at_the_cap_too(models_dir) -> None:
    sent: list = []
    w = _worker(models_dir, 0, [], _config(0.0, "latency"), 0.0, sent)
    batch = _capped(5, "depth<=0")
    w.compute(batch, w.config, 0.0)
    ramp_pred, _final = _reference(models_dir, batch.inputs["x"])
    got = _answers(sent)
    assert {k: v[1:] for k, v in got.items()} == {f"c1-{i}": (0, "depth<=0") for i in range(5)}
    assert [got[f"c1-{i}"][0] for i in range(5)] == ramp_pred[0][:5].tolist()
    assert w.telemetry.samples == 0


@pytest.mark.parametrize("variant", ["depth<=9", "depth<=two"])
def test_a_malformed_cap_is_a_bad_request(models_dir, variant: str) -> None:
    @in_loop
    def go() -> None:
        w = _worker(models_dir, 0, [], _config(0.0), 0.0, [])
        with pytest.raises(ServingError) as err:
            _run(w, [_capped(3, variant)])
        assert err.value.code == errors.BAD_REQUEST

    go()
