"""A worker sets feedback runs aside for waiting requests (tiny, real runtime)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest

from schemas import subjects
from schemas.messages import Batch, ExitConfig, Results, decode_map
from schemas.telemetry import RequestTelemetry
from services.common import config as config_mod
from services.worker.feedback_backlog import SetAside


def _worker(models_dir, backlog: int, use_taps: bool = True):
    from services.runtime.manifest import Manifest
    from services.runtime.stage import StageRuntime
    from services.worker.service import StagePlan, Worker

    d = models_dir / "efficientnet-lite0"
    manifest = Manifest.load(d)
    runtime = StageRuntime(d, manifest, 0, manifest.num_blocks, use_taps=use_taps)
    cfg = dataclasses.replace(config_mod.load(), feedback_backlog=backlog)
    plan = StagePlan("efficientnet-lite0", 0, 1, 0, manifest.num_blocks)
    w = Worker(SimpleNamespace(max_payload=8 << 20), cfg, plan, manifest, runtime, None,
               logging.getLogger("test"))
    sent: list[tuple[str, bytes]] = []
    w._publish = sent.extend  # what would go on the bus, in order
    return w, sent


def _batch(name: str, n: int = 2) -> Batch:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (n, 3, 224, 224), dtype=np.uint8)
    return Batch(name, "efficientnet-lite0", 0, "router.r", [f"{name}-{i}" for i in range(n)],
                 1, {"image": frames})


def _results(sent):
    return [Results.decode(decode_map(m[1])) for m in sent if m[0] == "router.r"]


@pytest.mark.parametrize("use_taps", [True, False], ids=["tapped", "split"])
def test_a_waiting_request_stops_a_feedback_run_and_the_rerun_completes_it(
        models_dir, use_taps) -> None:
    async def go():
        w, sent = _worker(models_dir, backlog=4, use_taps=use_taps)
        cfg = ExitConfig("efficientnet-lite0", 1, thresholds={3: 1.0}, active=[3])
        w.queue.put_nowait((_batch("next"), 0.0))     # a request is waiting
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, w.compute, _batch("a"), cfg, 0.0)
        await asyncio.sleep(0)                          # the loop publishes what was handed over
        res = _results(sent)
        early = [r for r in res if r.early]
        assert [i for r in early for i in r.ids] == ["a-0", "a-1"]  # every answer left at ramp 3
        assert all(r.exits.tolist() == [3] * len(r.ids) for r in early)
        assert [r.release for r in res] == [False] * len(early) + [True]  # credit back at once
        assert not [r for r in res if not r.early and r.ids]   # no final answers
        assert len(w.backlog) == 1 and w.backlog.cut == 1
        assert not w.telemetry.parts                    # no feedback yet

        w.queue.get_nowait()                            # idle now: the re-run goes to the end
        sent.clear()
        await w.process_set_aside()
        await asyncio.sleep(0)
        assert _results(sent) == [] and len(w.backlog) == 0 and w.backlog.rerun == 1
        tel = w.telemetry.take()
        assert tel.ids == ["a-0", "a-1"] and tel.config_version == 1
        assert tel.exit_at.tolist() == [3, 3] and tel.ramp_ids == [3]
        assert len(tel.final_pred) == 2
        # the same frames run to the end without a waiting request: the same feedback
        w2, _ = _worker(models_dir, backlog=4, use_taps=use_taps)
        await loop.run_in_executor(None, w2.compute, _batch("a"), cfg, 0.0)
        await asyncio.sleep(0)
        ref = w2.telemetry.take()
        assert ref.final_pred.tolist() == tel.final_pred.tolist()
        assert np.allclose(ref.ramp_score, tel.ramp_score) and w2.backlog.cut == 0

    asyncio.run(asyncio.wait_for(go(), 60))


def test_without_a_backlog_or_room_runs_go_to_the_end(models_dir) -> None:
    async def go():
        cfg = ExitConfig("efficientnet-lite0", 1, thresholds={3: 1.0}, active=[3])
        for backlog in (0, 1):
            w, sent = _worker(models_dir, backlog=backlog)
            if backlog:
                w.backlog.set_aside(SetAside(_batch("old"), cfg, 0.0, np.full(2, 3, np.int32)),
                                    rerun=False)        # full already
            w.queue.put_nowait((_batch("next"), 0.0))
            await asyncio.get_running_loop().run_in_executor(None, w.compute, _batch("a"),
                                                             cfg, 0.0)
            await asyncio.sleep(0)
            assert [r.release for r in _results(sent)][-1] is True
            assert w.telemetry.parts, f"backlog {backlog}: the run went to the end"
            assert len(w.backlog) == backlog
        # a stopping worker drains what was set aside
        await w.drain_feedback()
        assert len(w.backlog) == 0 and w.backlog.rerun == 1

    asyncio.run(asyncio.wait_for(go(), 60))


def test_inline_threshold_decides_where_a_batch_runs(models_dir, monkeypatch) -> None:
    """OFFRAMP_INLINE_MS: a batch expected to compute faster runs on the event loop (and then
    cannot give way); 0 sends every batch to a thread; bad values are refused."""
    async def go():
        w, _ = _worker(models_dir, backlog=4)
        one, four = _batch("one", 1), _batch("four", 4)
        for ms, want in ((0.0, (False, False)), (w.stage_ms * 2, (True, False)),
                         (w.stage_ms * 5, (True, True))):
            w.cfg = dataclasses.replace(w.cfg, inline_ms=ms)
            assert (w._is_inline(one), w._is_inline(four)) == want, ms

    asyncio.run(go())
    for bad in ("-1", "nan", "inf", "x"):
        monkeypatch.setenv("OFFRAMP_INLINE_MS", bad)
        with pytest.raises(config_mod.ConfigError, match="OFFRAMP_INLINE_MS"):
            config_mod.load()


def test_an_answer_past_its_slo_reaches_the_client_as_deadline_exceeded_once(models_dir):
    """One reply per request: a dispatched request is its worker's to answer; one whose
    answer comes at an age of its SLO or more gets deadline_exceeded from the worker (not the
    answer, and not also from the router, which the worker tells to record it)."""
    from schemas.messages import decode_map as dm

    async def go():
        w, sent = _worker(models_dir, backlog=0)
        cfg = ExitConfig("efficientnet-lite0", 1, thresholds={}, active=[])
        b = _batch("d", 2)
        b.replies, b.ages_ms, b.slos_ms = ["inbox.0", "inbox.1"], [5.0, 900.0], [1000.0, 50.0]
        await asyncio.get_running_loop().run_in_executor(None, w.compute, b, cfg,
                                                         time.monotonic())
        await asyncio.sleep(0)
        replies = [(m[0], dm(m[1])) for m in sent if m[0].startswith("inbox.")]
        to_client = dict(replies)
        assert sorted(s for s, _ in replies) == ["inbox.0", "inbox.1"]  # one message each
        # the worker stores what it answered, in the write that answers, before the answers
        first = [m[0] for m in sent].index("inbox.0")
        rows = [m for m in sent[:first] if m[0] == subjects.telemetry_requests(cfg.model)]
        assert len(rows) == 1 and rows[0][2]  # with its own message id
        records = RequestTelemetry.decode(dm(rows[0][1])).records
        assert [(r.id, r.status, r.exit) for r in records] == [
            ("d-0", "ok", -1), ("d-1", "deadline_exceeded", None)]
        assert to_client["inbox.0"]["id"] == "d-0" and "error" not in to_client["inbox.0"]
        assert to_client["inbox.1"]["error"]["code"] == "deadline_exceeded"
        res = _results(sent)
        late = [r for r in res if r.error]
        assert [(r.ids, r.direct, r.error["code"]) for r in late] == [
            (["d-1"], True, "deadline_exceeded")]               # recorded, not answered again
        assert [i for r in res if not r.error for i in r.ids] == ["d-0"]
        assert w.late_answers == 1

    asyncio.run(asyncio.wait_for(go(), 60))
