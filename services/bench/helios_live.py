"""``offramp bench helios`` live (without ``--sim``): HELIOS against the candidates alone,
each policy served by its own private stack on this machine, on one drifting prompt stream.

    offramp bench helios --json OUT [--models smollm2-135m] [--requests 120]
        [--max-tokens 64] [--prompt-tokens 32] [--concurrency 4] [--think-ms 0]
        [--threshold 0.9] [--heads all] [--ri 40] [--eval-prompts 5] [--drift-every N]
        [--seed 0] [--policies alone,alone-noexit,helios] [--judge MODEL] [--no-judge]

The stream is the replay's (``services.bench.helios``): held-out prose and code openings cut
to ``--prompt-tokens`` tokens, drawn by ``drifting_stream`` (same seed, same stream), sent
as token ids so every policy gets the same prompts. ``--concurrency`` clients send them
closed-loop: each sends its next request when its stream ended (after ``--think-ms``).

Policies, each on a fresh stack (``offramp up``'s supervisor: own state folder, NATS and
store under ``$OFFRAMP_HOME/bench-helios-live``), one after the other:

- ``alone:<candidate>``: fully loaded, exit heads (``--heads``, default all) at
  ``--threshold``, no HELIOS (EE-LLM style);
- ``alone-noexit:<candidate>``: fully loaded, no exit head (the plain model);
- ``helios``: ``offramp up --adapt`` serving the first candidate (HELIOS service and tuner,
  RI and evaluation share from ``--ri``/``--eval-prompts``), the other ``--models`` in its
  repository: HELIOS chooses the candidate and its loaded depth, and the worker switches
  (each switch's background read, and how long its open streams took to end on the
  candidate they started on, are reported).

Per policy: wall time, tokens/s, TTFT/TPOT percentiles (the done messages' timings), failed
requests with their errors, the depth each request was served at, HELIOS's decisions (its
store) and the worker's measured loads and slots (its log), memory per request, and after
the stacks stop the perplexity of every answer judged by the full model (teacher-forced).
"""

from __future__ import annotations

import asyncio
import math
import re
import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC
from pathlib import Path
from typing import Any

import numpy as np

from services.bench.helios import (
    DEFAULT_MODELS,
    MB,
    names,
    per_kind,
    prepared_dir,
    say,
    trace_prompts,
    write_outputs,
)
from services.bench.report import machine
from services.common import bus
from services.common import config as config_mod
from services.common.client import InferError, generate
from services.common.credentials import login_for
from services.common.stats import percentile
from services.launcher.supervisor import Deployment, Supervisor, register_prepared
from services.sim.helios_trace import drifting_stream
from services.store.migrate import upgrade
from services.store.repository import Store

LIVE_REQUESTS = 120
LIVE_RI = 40        # 3 assessments in the default stream (HELIOS's own default is 150)
LIVE_CLIENTS = 4
KINDS = ("alone", "alone-noexit", "helios")
READY_S = 300.0     # a stack's services start (torch imports, model loads)
DECISION_S = 120.0  # HELIOS's first decision reaches the worker
SILENCE_S = 120.0   # a stream may wait this long for its next message (loads, queueing)
SETTLE_S = 2.0      # after the stream: the monitor stores the last generations (~1 s)
PROGRESS_EVERY = 10
TIMELINE_BINS = 40
KV = re.compile(r"(\w+)=(\S+)")
CHOICES = (
    ("live: every policy on its own private stack (offramp up's supervisor, own state folder, "
    "NATS server and store), one after the other on this machine, on the same stream"),
    ("closed loop: each client sends its next request when its stream ended (after think_ms);"
    " no warm-up: each stack's first request is cold"),
    ("tokens_per_s = answer tokens received / seconds from the first request sent to the last "
    "stream's end; the timeline bins tokens by when their chunk arrived"),
    ("TTFT and TPOT: the worker's done message (accepted -> first token; mean per token after "
    "the first)"),
    ("helios: the stream starts once the worker follows HELIOS's first decision (the "
    "evaluation of assessment 1); decisions from its store, loads and slots from the "
    "worker's log"),
    ("memory_bytes per request = weights resident at the served depth + KV of its prompt and "
    "answer tokens at each loaded layer (the repository footprint HELIOS plans with); helios "
    "also gives the generations table's memory_bytes (the worker's own count)"),
    "largest_batch = min(clients, the worker's slots at the depths it served)",
    ("perplexity = exp(-mean log p) of every answer token given its prompt and the answer "
    "before it, judged by the judge fully loaded (teacher-forced); token_agreement = share of "
    "answer tokens that are the judge's argmax there; same_as_greedy_prefix = share of each "
    "answer identical to the alone-noexit answer (greedy, full model) up to the first "
    "difference"),
)


@dataclass(frozen=True)
class Prompt:
    kind: str
    ids: list[int]


@dataclass(frozen=True)
class Policy:
    name: str
    kind: str                  # one of KINDS
    model: str                 # the served model the stream goes to
    models: tuple[str, ...]    # every model the stack serves
    candidates: tuple[str, ...] = ()  # HELIOS's repository beyond them (registered only)


@dataclass(frozen=True)
class Load:
    """What every policy serves: the prompts, the stream (prompt indices) and the clients."""

    prompts: list[Prompt]
    stream: list[int]
    max_tokens: int
    clients: int
    think_s: float


def run_live(args) -> int:
    base = config_mod.load()
    models = names(getattr(args, "models", None)) or list(DEFAULT_MODELS)
    judge_name = getattr(args, "judge", None) or models[0]
    rows = footprints(base, [*models, judge_name])
    chosen = policies(models, getattr(args, "policies", None))
    settings = stack_settings(args)
    check_heads(settings["llm_heads"], {m: rows[m] for m in models})
    load = make_load(base, models[0], args)
    root = base.home / "bench-helios-live"
    shutil.rmtree(root, ignore_errors=True)  # the previous run's stacks (logs, stores)
    say(f"helios live: {', '.join(p.name for p in chosen)}; {len(load.stream)} requests x "
        f"{load.max_tokens} tokens, {load.clients} clients, threshold {settings['llm_threshold']}"
        f", RI {settings['helios_ri']}, eval {settings['helios_eval_prompts']}; stacks in {root}")
    results = {}
    for pol in chosen:
        cfg = stack_config(base, root / re.sub(r"[^a-z0-9]+", "-", pol.name.lower()), pol,
                           settings)
        results[pol.name] = run_policy(pol, cfg, load, rows)
    doc = report(args, base, models, judge_name, load, settings, root, results)
    if not getattr(args, "no_judge", False):
        say(f"judging every answer with {judge_name} fully loaded (teacher-forced)")
        judge(doc, load.prompts, prepared_dir(base, judge_name), base.ort_threads)
    return write_outputs(doc, args, table, plot)


# -- setup -----------------------------------------------------------------------------------


def footprints(base, models: list[str]) -> dict[str, dict[str, Any]]:
    """Each prepared model's repository row (no torch); every one must share the first's
    tokenizer: the stream is token ids, and perplexities compare only within one family."""
    from services.runtime.llm_footprint import candidate_row

    rows = {m: candidate_row(prepared_dir(base, m)) for m in dict.fromkeys(models)}
    first = next(iter(rows.values()))
    other = [m for m, r in rows.items() if r["family"] != first["family"]]
    if other:
        raise SystemExit(f"error: {', '.join(other)} do(es) not share {first['name']}'s "
                         "tokenizer: HELIOS's candidates and the judge must")
    return rows


def check_heads(heads: str, rows: dict[str, dict[str, Any]]) -> None:
    """``--heads`` before any stack starts: a worker refuses unknown heads at start, and
    its stack would wait for it in vain."""
    if heads in ("all", "last"):
        return
    try:
        layers = {int(k) for k in heads.split(",") if k.strip()}
    except ValueError:
        raise SystemExit(f"error: --heads {heads!r}: give `all`, `last` or head layers") from None
    for name, r in rows.items():
        missing = sorted(layers - set(r["exit_layers"][:-1]))  # the last one is the model's end
        if missing:
            raise SystemExit(f"error: {name} has no exit head after layer(s) {missing}; its "
                             f"heads: {r['exit_layers'][:-1]}")


def policies(models: list[str], wanted: str | None) -> list[Policy]:
    """The policies ``--policies`` names (kinds or full names; default every kind)."""
    every = [Policy(f"{k}:{m}", k, m, (m,)) for k in KINDS[:2] for m in models]
    # HELIOS serves the first model's stream; the other candidates are in its repository,
    # and its worker switches to one when a decision names it
    every.append(Policy("helios", "helios", models[0], (models[0],), tuple(models[1:])))
    asked = names(wanted)
    if not asked:
        return every
    known = {p.name for p in every} | set(KINDS)
    unknown = [w for w in asked if w not in known]
    if unknown:
        raise SystemExit(f"error: --policies: unknown {', '.join(unknown)}; known: "
                         f"{', '.join(KINDS)} or {', '.join(p.name for p in every)}")
    return [p for p in every if p.name in asked or p.kind in asked]


def make_load(base, model: str, args) -> Load:
    """The replay's prompts (held-out prose and code openings, the same texts for every
    candidate) cut to ``--prompt-tokens`` token ids, and the drifting stream over them."""
    from transformers import AutoTokenizer

    from services.runtime.llm_manifest import LlmManifest
    from services.zoo import llm_corpus

    say("loading the held-out prose and code for the prompts")
    tok = AutoTokenizer.from_pretrained(LlmManifest.load(prepared_dir(base, model)).tokenizer)
    corpus = llm_corpus.load_corpus(0, 0.2, base.home / "data")
    texts = trace_prompts({k: corpus.held[k] for k in corpus.kinds}, per_kind(args),
                          args.prompt_tokens)
    prompts = [Prompt(kind, list(tok.encode(text))[:args.prompt_tokens]) for kind, text in texts]
    requests = args.requests or LIVE_REQUESTS
    drift = getattr(args, "drift_every", None) or max(1, requests // 4)
    stream = drifting_stream([p.kind for p in prompts], requests, drift, args.seed)
    return Load(prompts, stream, args.max_tokens, getattr(args, "concurrency", None)
                or LIVE_CLIENTS, (getattr(args, "think_ms", None) or 0.0) / 1e3)


def stack_settings(args) -> dict[str, Any]:
    return {"llm_threshold": args.threshold, "llm_heads": getattr(args, "heads", None) or "all",
            "helios_ri": getattr(args, "ri", None) or LIVE_RI,
            "helios_eval_prompts": getattr(args, "eval_prompts", None) or 5}


def stack_config(base, home: Path, pol: Policy, settings: dict[str, Any]):
    """A private stack's config: HELIOS only for ``helios`` (adapt on, no fixed depth), exit
    heads for every policy but ``alone-noexit``."""
    heads = "" if pol.kind == "alone-noexit" else settings["llm_heads"]
    return replace(base, home=home, models=pol.models, nats_url=None,
                   database_url=f"sqlite:///{home / 'offramp.db'}", adapt=pol.kind == "helios",
                   llm_depth=0, llm_threshold=settings["llm_threshold"], llm_heads=heads,
                   helios_ri=settings["helios_ri"],
                   helios_eval_prompts=settings["helios_eval_prompts"])


def private_state(cfg, candidates: tuple[str, ...] = ()) -> None:
    """The stack's store with its models registered. Not ``prepare_state``: it would prepare
    smollm2 again under the private home (its fp32 copy and corpus cache live in the user's
    OFFRAMP_HOME, and a changed corpus retrains the heads); the prepared folders are used."""
    cfg.home.mkdir(parents=True, exist_ok=True)
    upgrade(cfg.database_url)
    with Store(cfg.database_url) as store:
        for name in dict.fromkeys([*cfg.models, *candidates]):
            register_prepared(store, prepared_dir(cfg, name), cfg.ramp_budget)


# -- one policy ------------------------------------------------------------------------------


def run_policy(pol: Policy, cfg, load: Load, rows: dict[str, dict[str, Any]]) -> dict:
    say(f"{pol.name}: starting a private stack ({', '.join(pol.models)}; adapt "
        f"{'on' if cfg.adapt else 'off'}, heads {cfg.llm_heads or 'none'})")
    private_state(cfg, pol.candidates)
    sup = Supervisor(cfg, Deployment(pol.models), log_dir=cfg.home / "logs")
    try:
        url = sup.start()
        sup.wait_ready(READY_S)
        log = next(c.log_file for c in sup.children if c.name == f"worker-{pol.model}-s0-r0")
        if pol.kind == "helios":
            await_helios(cfg, pol.model, log)
        say(f"{pol.name}: stack up, sending {len(load.stream)} requests")
        started = time.time()
        served = asyncio.run(drive(cfg, url, pol, load))
        if pol.kind == "helios":
            time.sleep(SETTLE_S)
    finally:
        sup.stop()
    out = figures(served, load.clients)
    out.update({"model": pol.model, "models": list(pol.models), "adapt": cfg.adapt,
                "heads": cfg.llm_heads or "none", "stack_dir": str(cfg.home)})
    out.update(worker_log(log, out["depths"], load.clients))
    if pol.kind == "helios":
        out["decisions"] = decisions(cfg, pol.model, started, out["worker_decisions"])
    memory(out, served, rows, load.prompts, cfg if pol.kind == "helios" else None)
    out["timeline"] = timeline(served, out["wall_s"])
    out["rows"] = served
    return out


def await_helios(cfg, model: str, log: Path) -> None:
    """Until the worker serves HELIOS's first decision (the evaluation of assessment 1):
    earlier requests would count toward no assessment."""
    deadline = time.monotonic() + DECISION_S
    with Store(cfg.database_url) as store:
        while (first := store.latest_helios_decision(model)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"HELIOS made no decision for {model} in {DECISION_S:.0f} s:"
                                   f" see {cfg.home / 'logs' / 'helios.log'}")
            time.sleep(0.2)
    mark = f"helios decision decision={first['id']} "
    while mark not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not follow HELIOS's decision {first['id']} in "
                               f"{DECISION_S:.0f} s: see {log}")
        time.sleep(0.2)


async def drive(cfg, url: str, pol: Policy, load: Load) -> list[dict[str, Any]]:
    """The stream, closed-loop: ``load.clients`` clients share one queue of requests."""
    nc = await bus.connect(url, "offramp-bench-helios", login=login_for(cfg, "client"))
    rows: list[dict[str, Any]] = [{} for _ in load.stream]
    todo = iter(range(len(load.stream)))
    t0 = time.monotonic()
    ended = [0, 0]  # streams, tokens

    async def client() -> None:
        for i in todo:  # a shared iterator: each request goes to one client
            rows[i] = await one(nc, pol.model, i, load, t0)
            ended[0] += 1
            ended[1] += len(rows[i]["tokens"])
            if ended[0] % PROGRESS_EVERY == 0 or ended[0] == len(rows):
                s = time.monotonic() - t0
                say(f"  {pol.name}: {ended[0]}/{len(rows)} streams, {ended[1]} tokens, "
                    f"{ended[1] / s:.1f} tok/s, {sum(not r.get('ok', True) for r in rows)} "
                    "failed")
            if load.think_s:
                await asyncio.sleep(load.think_s)

    try:
        await asyncio.gather(*(client() for _ in range(load.clients)))
    finally:
        await nc.close()
    return rows


async def one(nc, model: str, i: int, load: Load, t0: float) -> dict[str, Any]:
    """One stream: its token ids, when each arrived, and the done message's figures."""
    p = load.stream[i]
    row: dict[str, Any] = {"i": i, "prompt": p, "kind": load.prompts[p].kind,
                           "start_s": time.monotonic() - t0, "ok": False, "tokens": [],
                           "token_s": []}
    try:
        async for msg in generate(nc, model, prompt_tokens=load.prompts[p].ids,
                                  max_tokens=load.max_tokens, silence_s=SILENCE_S,
                                  request_id=f"bench-helios-{i}-{uuid.uuid4().hex[:8]}"):
            now = time.monotonic() - t0
            if msg.get("done"):
                row.update(ok=True, id=msg["id"], depth=int(msg.get("depth") or 0),
                           candidate=msg.get("candidate"), finish=msg.get("finish"),
                           exits={str(k): int(v) for k, v in (msg.get("exits") or {}).items()},
                           **{k: float(v) for k, v in msg["timings"].items()})
            else:
                row["tokens"] += [int(t) for t in msg["tokens"]]
                row["token_s"] += [now] * len(msg["tokens"])
    except InferError as exc:
        row["error"] = f"{exc.code}: {exc.message}"
    row["end_s"] = time.monotonic() - t0
    return row


# -- figures ---------------------------------------------------------------------------------


def _pcts(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95)}


def figures(rows: list[dict[str, Any]], clients: int) -> dict[str, Any]:
    ok = [r for r in rows if r["ok"]]
    tokens = sum(len(r["tokens"]) for r in rows)
    wall = max((r["end_s"] for r in rows), default=0.0)
    exits: Counter = Counter()
    for r in ok:
        exits.update({int(k): v for k, v in r["exits"].items()})
    n_exits = sum(exits.values())
    return {"requests": len(rows), "ok": len(ok), "failed": len(rows) - len(ok),
            "errors": [f"request {r['i']}: {r['error']}" for r in rows if not r["ok"]],
            "clients": clients, "wall_s": wall, "tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "ttft_ms": _pcts([r["ttft_ms"] for r in ok]),
            "tpot_ms": _pcts([r["tpot_ms"] for r in ok if len(r["tokens"]) > 1]),
            "depths": {str(d): n for d, n in sorted(Counter(r["depth"] for r in ok).items())},
            "candidates": dict(Counter(r["candidate"] for r in ok)),
            "exits": {str(k): v for k, v in sorted(exits.items())},
            "mean_layers": sum(k * v for k, v in exits.items()) / n_exits if n_exits else None}


def _log_fields(line: str, marker: str) -> dict[str, str] | None:
    at = line.find(marker)
    return None if at < 0 else dict(KV.findall(line[at + len(marker):]))


def worker_log(log: Path, depths: dict[str, int], clients: int) -> dict[str, Any]:
    """The worker's slots per depth (its ready line and every HELIOS decision it served) and
    the decisions it served with the measured load (``load_ms``, ``loaded_mb``)."""
    slots: dict[str, int] = {}
    served = []
    switches: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        if (ready := _log_fields(line, " llm worker ready ")) is not None:
            slots[ready["depth"]] = int(ready["slots"])
        elif (sw := _log_fields(line, " helios switch ")) is not None:
            switches.append({"from": sw.get("previous"), "to": sw.get("candidate"),
                             "depth": int(sw["depth"]), "read_ms": float(sw["read_ms"]),
                             "open_streams": int(sw["draining"])})
        elif (r := _log_fields(line, " helios drained ")) is not None and switches:
            switches[-1]["drain_ms"] = float(r["ms"])
        elif (d := _log_fields(line, " helios decision ")) is not None:
            slots[d["depth"]] = int(d["slots"])
            served.append({"decision": int(d["decision"]), "kind": d["kind"],
                           "depth": int(d["depth"]), "slots": int(d["slots"]),
                           "load_ms": float(d["load_ms"]) if "load_ms" in d else None,
                           "loaded_mb": float(d["loaded_mb"]) if "loaded_mb" in d else None})
    used = [slots[d] for d in depths if d in slots]
    return {"slots_by_depth": slots, "worker_decisions": served, "switches": switches,
            "largest_batch": min(clients, max(used)) if used else None}


def decisions(cfg, model: str, started: float, served: list[dict]) -> list[dict[str, Any]]:
    """HELIOS's decisions (its store), with when (s since the first request) and what the
    worker measured when it followed them."""
    by_id = {s["decision"]: s for s in served}
    with Store(cfg.database_url) as store:
        rows = store.helios_decisions(model)
    out = []
    for r in rows:
        w = by_id.get(r["id"], {})
        out.append({"id": r["id"], "kind": r["kind"], "candidate": r["candidate"],
                    "depth": r["depth"], "assessment": r["assessment"], "batch": r["batch"],
                    "at": r["at"].isoformat(),
                    "at_s": r["at"].replace(tzinfo=UTC).timestamp() - started,
                    "reason": r["reason"], "worker_followed": bool(w),
                    "worker_load_ms": w.get("load_ms"), "worker_loaded_mb": w.get("loaded_mb")})
    return out


def memory(out: dict, served: list[dict], rows: dict[str, dict], prompts: list[Prompt],
           helios_cfg) -> None:
    """Per request: weights at its depth + KV of its tokens (the repository footprint);
    for helios also the worker's own count from the generations of its assessments."""
    from services.optimizer.helios import kv_bytes, weight_bytes
    from services.optimizer.helios_service import candidate_of

    cands = {name: candidate_of(r) for name, r in rows.items()}
    for r in served:
        if r["ok"]:
            c = cands[r["candidate"]]
            r["memory_bytes"] = weight_bytes(c, r["depth"]) + kv_bytes(
                c, r["depth"], len(prompts[r["prompt"]].ids) + len(r["tokens"]))
    out["memory_bytes_median"] = percentile([r["memory_bytes"] for r in served if r["ok"]], 50)
    if helios_cfg is None:
        return
    stored = {}
    with Store(helios_cfg.database_url) as store:
        for a in {d["assessment"] for d in out["decisions"] if d["assessment"] is not None}:
            stored.update({g["request_id"]: g["memory_bytes"]
                           for g in store.generations(out["model"], a)})
    for r in served:
        if r.get("id") in stored:
            r["memory_stored_bytes"] = stored[r["id"]]
    out["memory_stored_median_bytes"] = percentile(list(stored.values()), 50)


def timeline(rows: list[dict], wall: float) -> dict[str, list[float]]:
    """Answer tokens per second in ``TIMELINE_BINS`` bins of the run, by chunk arrival."""
    width = max(wall, 1e-3) / TIMELINE_BINS
    counts = np.zeros(TIMELINE_BINS)
    for r in rows:
        for s in r.pop("token_s"):  # only the timeline needs them
            counts[min(TIMELINE_BINS - 1, int(s / width))] += 1
    return {"t_s": [round((k + 0.5) * width, 4) for k in range(TIMELINE_BINS)],
            "tokens_per_s": [round(c / width, 3) for c in counts]}


# -- judge -----------------------------------------------------------------------------------


def _score(model, prompt: list[int], tokens: list[int]) -> tuple[float, int]:
    """(summed log p of ``tokens`` after ``prompt``, tokens that are the argmax there): one
    teacher-forced pass of the full model."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    at = logits[len(prompt) - 1:len(prompt) - 1 + len(tokens)]
    t = torch.tensor(tokens)
    logp = torch.log_softmax(at, -1).gather(1, t[:, None])[:, 0]
    return float(logp.sum()), int((at.argmax(-1) == t).sum())


def _same_prefix(a: list[int], b: list[int]) -> float:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n / max(len(a), len(b), 1)


def judge(doc: dict[str, Any], prompts: list[Prompt], judge_dir: Path, threads: int) -> None:
    """Every policy's perplexity and token agreement under the judge, in place; and, where
    ``alone-noexit`` ran for the same model, how much of each answer is its greedy one."""
    from services.runtime.llm_model import load

    llm = load(judge_dir, threads)
    scored: dict[tuple, tuple[float, int]] = {}
    pols = doc["policies"]
    for name, pol in pols.items():
        logp = n = agree = 0
        for r in pol["rows"]:
            if not r["ok"] or not r["tokens"]:
                continue
            key = (r["prompt"], tuple(r["tokens"]))
            if key not in scored:  # policies often give the same answer
                scored[key] = _score(llm.model, prompts[r["prompt"]].ids, r["tokens"])
            r["judge_logprob"], r["judge_agree"] = scored[key]
            logp, n, agree = logp + scored[key][0], n + len(r["tokens"]), agree + scored[key][1]
        pol["perplexity"] = math.exp(-logp / n) if n else None
        pol["token_agreement"] = agree / n if n else None
        ref = pols.get(f"alone-noexit:{pol['model']}")
        if ref is not None:
            greedy = {r["i"]: r["tokens"] for r in ref["rows"] if r["ok"]}
            same = [_same_prefix(r["tokens"], greedy[r["i"]]) for r in pol["rows"]
                    if r["ok"] and r["i"] in greedy]
            pol["same_as_greedy_prefix"] = float(np.mean(same)) if same else None
        say(f"  {name}: perplexity {pol['perplexity']}, token agreement "
            f"{pol['token_agreement']}")


# -- report ----------------------------------------------------------------------------------


def report(args, base, models: list[str], judge_name: str, load: Load,
           settings: dict[str, Any], root: Path, results: dict) -> dict[str, Any]:
    return {"bench": "helios", "mode": "live", "machine": machine(), "models": models,
            "judge": None if getattr(args, "no_judge", False) else judge_name,
            "requests": len(load.stream), "max_tokens": load.max_tokens,
            "prompt_tokens": args.prompt_tokens, "clients": load.clients,
            "think_ms": load.think_s * 1e3, "seed": args.seed,
            "drift_every": getattr(args, "drift_every", None) or max(1, len(load.stream) // 4),
            "threshold": settings["llm_threshold"], "heads": settings["llm_heads"],
            "ri": settings["helios_ri"], "eval_prompts": settings["helios_eval_prompts"],
            "kv_budget_mb": base.kv_budget_mb, "slot_tokens": base.llm_slot_tokens,
            "ort_threads": base.ort_threads, "stacks_dir": str(root), "choices": list(CHOICES),
            "prompts": [{"kind": p.kind, "ids": p.ids} for p in load.prompts],
            "stream": load.stream, "stream_kinds": [load.prompts[p].kind for p in load.stream],
            "policies": results}


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def table(doc: dict[str, Any]) -> str:
    lines = [(f"\nlive ({doc['requests']} requests x {doc['max_tokens']} tokens, "
             f"{doc['clients']} clients, threshold {doc['threshold']})"),
             (f"{'policy':<28} {'ok/fail':>8} {'wall s':>7} {'tok/s':>7} {'TTFT p50/p95':>14} "
             f"{'TPOT p50/p95':>13} {'depths':>14} {'batch':>5} {'MB/req':>7} {'ppl':>8} "
             f"{'agree':>6}")]
    for name, p in doc["policies"].items():
        depths = ",".join(f"{d}x{n}" for d, n in p["depths"].items())
        if len(p.get("candidates", {})) > 1:  # which candidate served how many
            depths = ",".join(f"{c}x{n}" for c, n in p["candidates"].items())
        mem = None if p["memory_bytes_median"] is None else p["memory_bytes_median"] / MB
        agree = p.get("token_agreement")
        lines.append(
            f"{name:<28} {p['ok']:>4}/{p['failed']:<3} {p['wall_s']:>7.1f} "
            f"{p['tokens_per_s']:>7.1f} {_fmt(p['ttft_ms']['p50']):>6}/{_fmt(p['ttft_ms']['p95']):<7}"
            f" {_fmt(p['tpot_ms']['p50']):>5}/{_fmt(p['tpot_ms']['p95']):<7} {depths:>14} "
            f"{p['largest_batch'] or '-':>5} {_fmt(mem, '.2f'):>7} "
            f"{_fmt(p.get('perplexity'), '.3f'):>8} "
            f"{_fmt(None if agree is None else 100 * agree):>5}%")
        lines += [f"  error: {e}" for e in p["errors"][:5]]
        for d in p.get("decisions", []):
            moved = "" if d["worker_load_ms"] is None else f", worker load {d['worker_load_ms']} ms"
            lines.append(f"  {d['at_s']:>7.1f} s  {d['kind']:<8} {d['candidate']}@{d['depth']} "
                         f"assessment {d['assessment']}, batch {d['batch']}{moved}")
        lines += [f"  switch {w['from']} -> {w['to']}@{w['depth']}: read {w['read_ms']:.0f} ms "
                  f"in the background; {w['open_streams']} open streams ended on "
                  f"{w['from']} within {_fmt(w.get('drain_ms'), '.0f')} ms"
                  for w in p.get("switches", [])]
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Tokens/s over time per policy, and the depth each request was served at by when it
    was sent (HELIOS's depth over time); matplotlib when installed, else SVG."""
    from services.bench.plot import save_panels

    pols = doc["policies"]
    tps = [(n, np.array(p["timeline"]["t_s"]), np.array(p["timeline"]["tokens_per_s"]))
           for n, p in pols.items()]
    depth = []
    for n, p in pols.items():
        ok = sorted((r["start_s"], r["depth"]) for r in p["rows"] if r["ok"])
        depth.append((n, np.array([s for s, _ in ok]), np.array([float(d) for _, d in ok])))
    top = max([float(y.max()) for _, _, y in tps if y.size] + [1.0])
    deepest = max([float(y.max()) for _, _, y in depth if y.size] + [1.0])
    panels = [("tokens/s (measured)", tps, top * 1.05),
              ("depth served, by request sent", depth, deepest)]
    x_max = max([p["wall_s"] for p in pols.values()] + [1.0])
    title = f"HELIOS live ({doc['mode']}), threshold {doc['threshold']}"
    return save_panels(title, panels, "s", x_max, path)
