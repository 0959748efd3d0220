"""HELIOS switches an LLM worker to another candidate of its family mid-stream: the new
candidate is read in the background, new streams start on it while the open ones end on the
candidate they started on; an evaluated candidate's answers are judged by the served model;
a candidate that is not prepared or has another tokenizer is refused and nothing changes."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from schemas.generation import GenerateRequest, LlmWork
from schemas.helios import GenerationTelemetry, HeliosChoice
from schemas.messages import decode_map
from schemas.telemetry import RequestTelemetry
from services.common import config as config_mod
from services.prepare.llm_models import prepare_tiny
from tests.conftest import llm_twin

MODEL = "tiny-llm"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("models")
    prepare_tiny(folder, log=lambda _m: None)
    llm_twin(folder, "tiny-twin")
    llm_twin(folder, "tiny-other-tokens", tokenizer_change=True)
    llm_twin(folder, "tiny-other", perturb=True)  # same tokenizer, other weights
    return folder


def _run(models: Path, plan, writes: list | None = None) -> tuple[list, list]:
    """Serve on a worker of ``MODEL``; ``plan(worker, submit)`` drives it. Returns (the
    worker's writes, also in ``writes`` as they happen, and [worker])."""
    import services.worker.llm_service as svc
    from services.runtime.llm_model import load

    cfg = dataclasses.replace(config_mod.load(), models_dir=models, kv_budget_mb=64,
                              llm_heads="", llm_threshold=1.0)
    writes = [] if writes is None else writes
    held: list = []

    async def go() -> None:
        original = svc.publish_all
        svc.publish_all = lambda nc, messages, log: writes.append(list(messages))
        try:
            w = svc.LlmWorker(SimpleNamespace(), cfg, MODEL, load(models / MODEL),
                              logging.getLogger("t"))
            held.append(w)
            stop = asyncio.Event()
            task = asyncio.ensure_future(w.run(stop))

            def submit(req: GenerateRequest) -> None:
                w.on_work(SimpleNamespace(data=LlmWork("offramp.results.r", f"_INBOX.{req.id}",
                                                       req.encode()).encode()))

            await plan(w, submit)
            while w.waiting or w.active:
                await asyncio.sleep(0.005)
            stop.set()
            w.wake.set()
            await task
        finally:
            svc.publish_all = original

    asyncio.run(asyncio.wait_for(go(), 120))
    return writes, held


def _choice(decision: int, candidate: str, depth: int = 6) -> SimpleNamespace:
    kind = "switch" if candidate != MODEL else "stay"
    return SimpleNamespace(data=HeliosChoice(MODEL, decision, kind, candidate, depth,
                                             1).encode())


def _tokens(writes, rid: str) -> list[int]:
    return [t for w in writes for s, d, *_ in w if s == f"_INBOX.{rid}"
            for t in decode_map(d).get("tokens", [])]


def _records(writes, rid: str):
    rows = [RequestTelemetry.decode(decode_map(d)).records[0] for w in writes for s, d, *_ in w
            if s.startswith("offramp.telemetry.requests.")
            and RequestTelemetry.decode(decode_map(d)).records[0].id == rid]
    gens = [GenerationTelemetry.decode(decode_map(d)).records[0] for w in writes
            for s, d, *_ in w if s.startswith("offramp.telemetry.generation.")
            and GenerationTelemetry.decode(decode_map(d)).records[0].id == rid]
    return rows, gens


def _sent_before_terminal(writes, rid: str) -> bool:
    """Whether ``rid``'s first generation record went out in the write that ended its
    stream, ahead of the terminal message."""
    for w in writes:
        subjects_sent = [s for s, *_ in w]
        gens = [i for i, (s, d, *_) in enumerate(w) if s.startswith("offramp.telemetry.generation.")
                and GenerationTelemetry.decode(decode_map(d)).records[0].id == rid]
        if gens:
            return f"_INBOX.{rid}" in subjects_sent[gens[0]:]
    return False


def _greedy(models: Path, prompt: str, n: int, name: str = MODEL) -> list[int]:
    from services.runtime.llm_model import load

    llm = load(models / name)
    ids = torch.tensor([llm.tokenizer.encode(prompt)])
    out = llm.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=llm.tokenizer.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


def _until_eos(tokens: list[int], eos) -> list[int]:
    return tokens[:next((i for i, t in enumerate(tokens) if t in eos), len(tokens))]


def test_a_switch_mid_stream_goes_on_exactly_under_the_new_candidate(models, monkeypatch,
                                                                      caplog):
    import services.worker.llm_service as svc

    original = svc.LlmWorker._round

    def slow(self, new, running):  # rounds outlast the twin's read: the switch is mid-stream
        time.sleep(0.02)
        return original(self, new, running)

    monkeypatch.setattr(svc.LlmWorker, "_round", slow)
    prompt = "Once upon a time"

    async def plan(w, submit) -> None:
        submit(GenerateRequest("a", MODEL, 30, prompt=prompt))
        tokenizer = w.llm.tokenizer
        while w.rounds < 3:
            await asyncio.sleep(0.001)
        w.on_choice(_choice(5, "tiny-twin"))
        while w.candidate != "tiny-twin":
            await asyncio.sleep(0.001)
        assert w.llm.tokenizer is tokenizer  # same family: reused, not read again
        submit(GenerateRequest("b", MODEL, 5, prompt=prompt))

    with caplog.at_level(logging.INFO, logger="t"):
        writes, (w,) = _run(models, plan)
    assert w.candidate == "tiny-twin" and w.choice.candidate == "tiny-twin"
    said = [r.getMessage() for r in caplog.records]
    assert any("draining=1" in m for m in said)  # "a" was open at the switch ...
    assert any("helios drained candidate=tiny-llm" in m for m in said)  # ... and ended there
    want = _until_eos(_greedy(models, prompt, 30), w.eos)
    got = _tokens(writes, "a")
    # the open stream ends on the candidate it started on, stepped beside the new one
    assert got == want and len(got) > 3
    rows, gens = _records(writes, "a")
    assert rows[0].variant == "tiny-llm@6" and gens[0].candidate == "tiny-llm"  # started there
    rows, gens = _records(writes, "b")
    assert rows[0].variant == "tiny-twin@6" and gens[0].candidate == "tiny-twin"
    assert _tokens(writes, "b") == want[:5]


def test_each_stream_is_charged_only_its_own_candidates_decoding_call(monkeypatch):
    # a round prefills new streams and steps both candidates while one drains: each stream's
    # decode time is the call that advanced it (a fake clock the fake decoders move)
    import services.worker.llm_service as svc

    clock = [0.0]
    monkeypatch.setattr(svc.time, "perf_counter", lambda: clock[0])

    def decoder(prefill_s: float, step_s: float) -> SimpleNamespace:
        def run(seconds):
            def call(seqs, *_):
                clock[0] += seconds
                return [q.request_id for q in seqs]
            return call
        return SimpleNamespace(prefill=run(prefill_s), step=run(step_s))

    worker = SimpleNamespace(decoder=decoder(0.010, 0.030), thresholds={}, rounds=0,
                             old=SimpleNamespace(decoder=decoder(9.0, 0.050), thresholds={},
                                                 ids={"old"}))
    seq = [SimpleNamespace(request_id=r) for r in ("new", "mine", "old")]
    results, spent = svc.LlmWorker._round(worker, seq[:1], seq[1:])
    assert sorted(results) == ["mine", "new", "old"] and worker.rounds == 1
    assert spent == {"new": pytest.approx(10.0), "mine": pytest.approx(30.0),
                     "old": pytest.approx(50.0)}


def test_a_switch_to_a_partial_depth_releases_the_layers_above(models):
    async def plan(w, submit) -> None:
        w.on_choice(_choice(3, "tiny-twin", depth=4))
        while w.candidate != "tiny-twin" or w.choice is None:
            await asyncio.sleep(0.002)
        submit(GenerateRequest("p", MODEL, 4, prompt="The sea"))

    writes, (w,) = _run(models, plan)
    assert w.decoder.depth == 4 and not w.loader.resident(5) and w.loader.resident(4)
    rows, gens = _records(writes, "p")
    assert rows[0].variant == "tiny-twin@4" and gens[0].depth == 4


@pytest.mark.parametrize("candidate, depth, why", [
    ("not-prepared", 6, "not prepared"),
    ("tiny-other-tokens", 6, "tokenizer"),
    ("tiny-twin", 3, "no exit head"),
])
def test_a_switch_it_cannot_make_is_refused_and_nothing_changes(models, caplog, candidate,
                                                                depth, why):
    async def plan(w, submit) -> None:
        with caplog.at_level(logging.ERROR, logger="t"):
            w.on_choice(_choice(4, candidate, depth))
        assert w.next_choice is None
        submit(GenerateRequest("r", MODEL, 3, prompt="The sea"))

    writes, (w,) = _run(models, plan)
    assert w.candidate == MODEL and w.choice is None
    assert any(why in r.getMessage() for r in caplog.records)
    assert _records(writes, "r")[0][0].variant == "tiny-llm@6"


def test_an_evaluated_candidates_streams_are_judged_by_the_served_model(models):
    async def plan(w, submit) -> None:
        w.on_choice(SimpleNamespace(data=HeliosChoice(MODEL, 3, "evaluate", "tiny-twin", 6,
                                                      1).encode()))
        while w.candidate != "tiny-twin" or w.choice is None:
            await asyncio.sleep(0.002)
        assert w.judge is not None  # the served model, kept while the twin is evaluated
        submit(GenerateRequest("e", MODEL, 6, prompt="The sea"))
        while len(_records(writes_so_far, "e")[1]) < 2:  # on record, then judged
            await asyncio.sleep(0.005)
        w.on_choice(_choice(4, MODEL))  # back to the served model: the judge, no read
        while w.candidate != MODEL:
            await asyncio.sleep(0.002)

    writes_so_far: list = []
    writes, (w,) = _run(models, plan, writes_so_far)
    rows, (pending, gen) = _records(writes, "e")
    # the stream went on record with its terminal message; the judge's score completed it
    assert pending.judging and pending.judged_logprob is None and not pending.completes
    assert gen.completes and not gen.judging and gen.tokens == pending.tokens
    assert _sent_before_terminal(writes, "e")
    assert rows[0].variant == "tiny-twin@6" and gen.candidate == "tiny-twin"
    # the twin has the served model's weights: the judge's log-probability is its own
    assert gen.judged_logprob == pytest.approx(gen.logprob, abs=1e-3) and gen.logprob < 0
    assert w.judge is None and w.candidate == MODEL


def test_after_its_share_of_streams_an_evaluated_candidate_hands_new_ones_back(models,
                                                                              monkeypatch,
                                                                              caplog):
    import services.worker.llm_service as svc

    original = svc.LlmWorker._round

    def slow(self, new, running):  # the evaluated streams are still open at the hand-back
        time.sleep(0.01)
        return original(self, new, running)

    monkeypatch.setattr(svc.LlmWorker, "_round", slow)

    async def plan(w, submit) -> None:
        w.cfg = dataclasses.replace(w.cfg, helios_eval_prompts=2)
        w.on_choice(SimpleNamespace(data=HeliosChoice(MODEL, 3, "evaluate", "tiny-other", 6,
                                                      1).encode()))
        while w.candidate != "tiny-other" or w.choice is None:
            await asyncio.sleep(0.002)
        for rid in ("e1", "e2"):
            submit(GenerateRequest(rid, MODEL, 20, prompt="The sea"))
            rounds = w.rounds
            while w.rounds == rounds:
                await asyncio.sleep(0.001)
        submit(GenerateRequest("e3", MODEL, 4, prompt="The sea"))  # beyond the share
        while w.candidate != MODEL:
            await asyncio.sleep(0.001)
        assert w.old is not None  # back; e1 and e2 end on the twin
        while not all(len(_records(sent, rid)[1]) == 2 for rid in ("e1", "e2")):  # judged
            await asyncio.sleep(0.005)

    sent: list = []
    with caplog.at_level(logging.INFO, logger="t"):
        writes, (w,) = _run(models, plan, sent)
    assert any("helios evaluation share started" in r.getMessage() for r in caplog.records)
    assert w.choice.kind == "evaluate" and w.choice.candidate == "tiny-other"  # still in force
    other = _until_eos(_greedy(models, "The sea", 20, "tiny-other"), w.eos)
    own = _until_eos(_greedy(models, "The sea", 20), w.eos)
    assert other != own  # the candidates answer differently: who decoded what shows
    for rid in ("e1", "e2"):
        rows, (pending, gen) = _records(writes, rid)
        assert pending.judging and rows[0].variant == "tiny-other@6"
        assert gen.judged_logprob is not None
        assert _tokens(writes, rid) == other  # decoded by it alone, beside the served model
        assert gen.judged_logprob != pytest.approx(gen.logprob)  # judged by the other model
    rows, (gen,) = _records(writes, "e3")
    assert rows[0].variant == "tiny-llm@6" and gen.assessment == 1
    assert _tokens(writes, "e3") == own[:4]
    assert w.old is None  # drained
