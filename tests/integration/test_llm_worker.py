"""The LLM worker on the tiny random Llama: streams join and leave a continuous batch, each
gets its chunks in order and one terminal message with the router's release in the same
write, the tokens are greedy decoding's when no exit head is sure enough, and bad prompts
are refused with a code."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from types import SimpleNamespace

import pytest
import torch

from schemas.generation import GenerateRequest, LlmWork
from schemas.helios import GenerationTelemetry, HeliosChoice
from schemas.messages import Results, decode_map
from schemas.telemetry import RequestRecord, RequestTelemetry
from services.common import config as config_mod
from services.runtime.llm_heads import ExitHeads
from services.runtime.llm_model import LoadedLlm
from services.zoo import tiny_llm

ROUTER = "offramp.results.router-t"
GEN = "offramp.telemetry.generation.tiny-llm"


@pytest.fixture(scope="module")
def llm() -> LoadedLlm:
    torch.set_num_threads(1)
    tok = tiny_llm.tokenizer()
    net = tiny_llm.model(len(tok))
    net.generation_config.eos_token_id = tok.eos_token_id
    heads = ExitHeads(64, [2, 4])
    return LoadedLlm(SimpleNamespace(name="tiny-llm"), net, tok, heads)


def _serve(llm: LoadedLlm, requests: list[GenerateRequest], threshold: float = 1.0,
           stagger: int = 0, heads: str = "all") -> list[list[tuple[str, bytes]]]:
    """Every write the worker makes while serving ``requests`` (the later ones ``stagger``
    rounds after the first)."""
    cfg = dataclasses.replace(config_mod.load(), llm_threshold=threshold, kv_budget_mb=64,
                              llm_heads=heads)
    return _serve_cfg(llm, requests, cfg, stagger)


def _serve_cfg(llm: LoadedLlm, requests: list[GenerateRequest], cfg, stagger: int = 0,
               choices: tuple[HeliosChoice, ...] = (),
               worker: list | None = None) -> list[list[tuple[str, bytes]]]:
    """... with HELIOS ``choices`` delivered (and adopted) before the requests; the worker
    is appended to ``worker``."""
    import services.worker.llm_service as svc

    writes: list[list[tuple[str, bytes]]] = []

    async def go() -> None:
        original = svc.publish_all
        svc.publish_all = lambda nc, messages, log: writes.append(list(messages))
        try:
            w = svc.LlmWorker(SimpleNamespace(), cfg, "tiny-llm", llm, logging.getLogger("t"))
            if worker is not None:
                worker.append(w)
            stop = asyncio.Event()
            task = asyncio.ensure_future(w.run(stop))
            for choice in choices:
                w.on_choice(SimpleNamespace(data=choice.encode()))
                while w.next_choice is not None or w.loading is not None:
                    await asyncio.sleep(0.002)
            for i, req in enumerate(requests):
                w.on_work(SimpleNamespace(data=LlmWork(ROUTER, f"_INBOX.c.{req.id}",
                                                       req.encode()).encode()))
                while i == 0 and stagger and w.rounds < stagger:
                    await asyncio.sleep(0.001)
            while w.waiting or w.active:
                await asyncio.sleep(0.005)
            stop.set()
            w.wake.set()
            await task
        finally:
            svc.publish_all = original

    asyncio.run(asyncio.wait_for(go(), 60))
    return writes


def _stream(writes, rid: str) -> list[dict]:
    return [decode_map(m[1]) for w in writes for m in w if m[0] == f"_INBOX.c.{rid}"]


def _row(write) -> RequestRecord:
    """The request row a stream's last write carries (first, before the answer)."""
    subject, data, msg_id = write[0]
    assert subject == "offramp.telemetry.requests.tiny-llm" and ":r" in msg_id
    telemetry = RequestTelemetry.decode(decode_map(data))
    assert telemetry.model == "tiny-llm" and len(telemetry.records) == 1
    return telemetry.records[0]


def _greedy(llm: LoadedLlm, prompt: str, n: int) -> list[int]:
    ids = torch.tensor([llm.tokenizer.encode(prompt)])
    out = llm.model.generate(ids, max_new_tokens=n, do_sample=False,
                             eos_token_id=llm.tokenizer.eos_token_id,
                             pad_token_id=llm.tokenizer.eos_token_id)
    return [t for t in out[0, ids.shape[1]:].tolist() if t != llm.tokenizer.eos_token_id]


def test_streams_in_a_continuous_batch_get_greedy_tokens_and_one_terminal_each(llm):
    reqs = [GenerateRequest("a", "tiny-llm", 12, prompt="Once upon a time"),
            GenerateRequest("b", "tiny-llm", 5, prompt="def add(x, y):")]
    writes = _serve(llm, reqs, stagger=3)
    for req in reqs:
        msgs = _stream(writes, req.id)
        chunks, (done,) = msgs[:-1], msgs[-1:]
        assert [c["seq"] for c in chunks] == list(range(len(chunks)))
        tokens = [t for c in chunks for t in c["tokens"]]
        assert tokens == _greedy(llm, req.prompt, req.max_tokens)
        assert done["done"] and done["usage"]["completion_tokens"] == len(tokens)
        assert done["finish"] in ("stop", "length") and done["candidate"] == "tiny-llm"
        assert "".join(c["text"] for c in chunks) == llm.tokenizer.decode(tokens)
        assert all(e == 6 for c in chunks for e in c["exits"])  # nobody sure at 1.0
        (end,) = [w for w in writes if any(m[0] == f"_INBOX.c.{req.id}" and b"done" in m[1]
                                           for m in w)]
        assert [m[0] for m in end][1:] == [GEN, f"_INBOX.c.{req.id}", ROUTER]   # one write
        release = Results.decode(decode_map(end[3][1]))
        assert release.release and release.batch_id == req.id and release.ids == []
        row = _row(end)  # ... with the stream's request row: who served it, how deep
        assert (row.id, row.status, row.variant) == (req.id, "ok", "tiny-llm@6")
        assert 0 < row.latency_ms < 60_000 and row.t <= time.time()


def test_exit_heads_answer_tokens_early_when_sure(llm):
    writes = _serve(llm, [GenerateRequest("e", "tiny-llm", 8, prompt="The sea")],
                    threshold=0.0)  # every token leaves at the first head
    chunks = _stream(writes, "e")[:-1]
    # the prompt's pass (prefill) runs every layer; each later token leaves at layer 2
    assert chunks[0]["exits"] == [6] and all(c["exits"] == [2] for c in chunks[1:])
    assert _stream(writes, "e")[-1]["exits"] == {6: 1, 2: len(chunks) - 1}


def test_a_prompt_too_long_for_a_stream_is_refused_and_released(llm):
    writes = _serve(llm, [GenerateRequest("x", "tiny-llm", 4000, prompt_tokens=[1] * 40)])
    (err,) = _stream(writes, "x")
    assert err["error"]["code"] == "bad_request" and "exceed" in err["error"]["message"]
    (w,) = writes
    assert Results.decode(decode_map(w[2][1])).batch_id == "x"
    row = _row(w)
    assert (row.id, row.status, row.variant) == ("x", "bad_request", None)
    writes = _serve(llm, [GenerateRequest("y", "tiny-llm", 4, prompt_tokens=[10**6])])
    assert "vocabulary" in _stream(writes, "y")[0]["error"]["message"]


def test_heads_are_evaluated_only_when_named(llm):
    from services.worker.llm_service import heads_in_use

    assert heads_in_use("", llm) == [] and heads_in_use("all", llm) == [2, 4]
    assert heads_in_use("4", llm) == [4] and heads_in_use("last", llm) == [4]
    for bad in ("3", "x"):
        with pytest.raises(SystemExit, match="OFFRAMP_LLM_HEADS"):
            heads_in_use(bad, llm)
    writes = _serve(llm, [GenerateRequest("n", "tiny-llm", 4, prompt="The sea")],
                    threshold=0.0, heads="")  # no head named: every token runs every layer
    assert all(e == 6 for c in _stream(writes, "n")[:-1] for e in c["exits"])


def test_a_partial_depth_answers_every_token_by_then_and_holds_more_streams(llm):
    import services.worker.llm_service as svc

    full = svc.slots_for(llm, 64, 1024)
    cfg = dataclasses.replace(config_mod.load(), kv_budget_mb=64, llm_depth=4, llm_heads="all")
    assert svc.loaded_depth(4, llm) == 4 and svc.loaded_depth(0, llm) == 6
    for bad in (3, 5, 7):
        with pytest.raises(SystemExit, match="OFFRAMP_LLM_DEPTH"):
            svc.loaded_depth(bad, llm)
    w = svc.LlmWorker(SimpleNamespace(), cfg, "tiny-llm", llm, logging.getLogger("t"))
    assert w.decoder.depth == 4 and set(w.thresholds) == {2} and w.slots > full
    writes = _serve_cfg(llm, [GenerateRequest("p", "tiny-llm", 6, prompt="The sea")], cfg)
    chunks, done = _stream(writes, "p")[:-1], _stream(writes, "p")[-1]
    assert done["depth"] == 4 and all(e <= 4 for c in chunks for e in c["exits"])
    (end,) = [w for w in writes if any(m[0] == "_INBOX.c.p" and b"done" in m[1] for m in w)]
    assert _row(end).variant == "tiny-llm@4"


def _generation(write):
    """The generation record a stream's last write carries (after its request row)."""
    subject, data, msg_id = write[1]
    assert subject == GEN and ":g" in msg_id
    telemetry = GenerationTelemetry.decode(decode_map(data))
    assert telemetry.model == "tiny-llm" and len(telemetry.records) == 1
    return telemetry.records[0]


def _end(writes, rid: str):
    (end,) = [w for w in writes if any(m[0] == f"_INBOX.c.{rid}" and b"done" in m[1]
                                       for m in w)]
    return end


def test_each_answered_stream_reports_what_served_it_and_how(llm):
    writes = _serve(llm, [GenerateRequest("g", "tiny-llm", 7, prompt="The sea")],
                    threshold=0.0)  # tokens after the first leave at layer 2
    done = _stream(writes, "g")[-1]
    rec = _generation(_end(writes, "g"))
    n = done["usage"]["completion_tokens"]
    assert (rec.id, rec.candidate, rec.depth, rec.assessment) == ("g", "tiny-llm", 6, None)
    assert rec.tokens == n and rec.exits == {int(k): v for k, v in done["exits"].items()}
    assert rec.breach_at == []  # fully loaded: nothing is missing
    assert rec.logprob < 0 and rec.memory_bytes > 0 and rec.duration_ms >= rec.ttft_ms


def test_a_streams_decode_time_is_its_candidates_calls_not_the_whole_round(llm, monkeypatch):
    import services.worker.llm_service as svc

    original = svc.LlmWorker._round
    pause_ms = 30.0

    def padded(self, new, running):  # work in the round that is not this candidate's decoding
        time.sleep(pause_ms / 1e3)
        return original(self, new, running)

    monkeypatch.setattr(svc.LlmWorker, "_round", padded)
    writes = _serve(llm, [GenerateRequest("d", "tiny-llm", 6, prompt="The sea")])
    rec = _generation(_end(writes, "d"))
    assert rec.tokens >= 2 and rec.decode_ms is not None and rec.decode_ms > 0
    # one pause per round before each token, none of them counted
    assert rec.decode_ms <= rec.duration_ms - pause_ms * rec.tokens


def _saved(llm: LoadedLlm, folder) -> LoadedLlm:
    """The tiny model with its weights saved, as preparation leaves a base model: what
    partial loading reads released layers back from."""
    llm.model.save_pretrained(folder)
    return dataclasses.replace(llm, manifest=SimpleNamespace(name="tiny-llm",
                                                             base={"fp32": str(folder)}))


def test_a_helios_decision_sets_the_depth_streams_report_breaches_and_a_deeper_one_is_exact(
        llm, tmp_path):
    saved = _saved(llm, tmp_path / "base")
    cfg = dataclasses.replace(config_mod.load(), kv_budget_mb=64, llm_heads="", llm_threshold=1.0)
    shallow = HeliosChoice("tiny-llm", 7, "load", "tiny-llm", 4, 2, threshold=1.0)
    workers: list = []
    writes = _serve_cfg(saved, [GenerateRequest("s", "tiny-llm", 6, prompt="The sea")], cfg,
                        choices=(shallow,), worker=workers)
    (w,) = workers
    assert w.decoder.depth == 4 and w.choice == shallow and w.slots > svc_slots(saved)
    assert not w.loader.resident(5) and w.loader.resident(4)  # released: memory returned
    rec = _generation(_end(writes, "s"))
    assert (rec.depth, rec.assessment) == (4, 2) and _row(_end(writes, "s")).variant == \
        "tiny-llm@4"
    # the head at 4 answers every token, never sure at threshold 1: each one is a breach
    assert set(rec.exits) == {4} and rec.breach_at == list(range(rec.tokens))
    deeper = HeliosChoice("tiny-llm", 8, "load", "tiny-llm", 6, 2)
    older = HeliosChoice("tiny-llm", 6, "stay", "tiny-llm", 4, 1)
    other = HeliosChoice("tiny-llm", 9, "switch", "other-llm", 4, 2)
    writes = _serve_cfg(saved, [GenerateRequest("d", "tiny-llm", 8, prompt="Once upon")], cfg,
                        choices=(shallow, deeper, older, other), worker=workers)
    w = workers[-1]
    assert w.decoder.depth == 6 and w.choice == deeper and w.loader.resident(6)
    tokens = [t for c in _stream(writes, "d")[:-1] for t in c["tokens"]]
    assert tokens == _greedy(llm, "Once upon", 8)  # read-back layers are the saved ones
    assert _generation(_end(writes, "d")).breach_at == []


def svc_slots(llm: LoadedLlm) -> int:
    import services.worker.llm_service as svc

    return svc.slots_for(llm, 64, 1024)


def test_early_tokens_are_checked_against_the_full_model_once_their_positions_get_there(
        llm, monkeypatch):
    import services.worker.llm_service as svc

    original = svc.LlmWorker._round

    def alternate(self, new, running):  # exits at head 2 every other round, none between
        self.thresholds = {2: 0.0} if self.rounds % 2 else {}
        return original(self, new, running)

    monkeypatch.setattr(svc.LlmWorker, "_round", alternate)
    prompt = "Once upon a time"
    writes = _serve(llm, [GenerateRequest("f", "tiny-llm", 9, prompt=prompt)], threshold=0.0)
    rec = _generation(_end(writes, "f"))
    tokens = [t for c in _stream(writes, "f")[:-1] for t in c["tokens"]]
    early = [i for i, e in enumerate(c for c in _stream(writes, "f")[:-1]) if e["exits"] == [2]]
    assert early and rec.checked == len([i for i in early if i + 1 < len(tokens)])
    ids = llm.tokenizer.encode(prompt)
    with torch.no_grad():  # the full model's token at each position of the served text
        full = llm.model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1:-1].argmax(-1)
    want = [(2, int(full[i] == tokens[i])) for i in early if i + 1 < len(tokens)]
    assert [(k, a) for k, _, a in rec.feedback] == want
    assert all(0 <= c <= 1 for _, c, _ in rec.feedback)
    misses = [i for i in early if i + 1 < len(tokens) and full[i] != tokens[i]]
    assert rec.first_deviation == (misses[0] if misses else None)
