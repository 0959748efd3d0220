"""``offramp bench helios --sim``: HELIOS against its ablations and the candidates alone, by
replaying recorded per-token exit traces through HELIOS's policy code
(``services.sim.helios_sim``) on a prompt stream that drifts between text kinds.

Traces live in ``--traces`` (default ``$OFFRAMP_HOME/traces/helios``), one per candidate
(``services.bench.helios_traces``); a missing one, or one recorded with other prompt or answer
lengths or another judge, is recorded first from the prepared model (``offramp prepare
NAME``), on the held-out prose and code of ``services.zoo.llm_corpus`` (the same texts for
every candidate). Policies: ``alone:<candidate>`` (fully loaded, exits at ``--threshold``),
``helios``, ``helios-no-switch``, ``helios-no-greedy``. Printed: one row per policy; written:
JSON marked as a replay simulation, and a plot of modeled throughput and the chosen
candidate and depth over the requests. Every time in it is modeled from the traces' timing
profiles (see the simulator's docstring), not measured.

Without ``--sim`` the same stream is served live, each policy on its own private stack
(``services.bench.helios_live``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from services.optimizer.helios_schedule import RI
from services.sim.helios_sim import (
    HELIOS_POLICIES,
    LOAD_MS_PER_BYTE,
    SimConfig,
    compare,
    equal_batch,
)
from services.sim.helios_trace import CandidateTrace, check_traces, drifting_stream

DEFAULT_MODELS = ("smollm2-135m",)
PROMPTS_PER_KIND = 8  # prompts of each kind in a trace; the stream draws from them
CHARS_PER_TOKEN = 6  # a held-out text qualifies with this many characters per prompt token
DEFAULT_REQUESTS = 600
DEFAULT_DRIFT = 100
MB = 1 << 20
CHOICES = (
    ("replay simulation: every token, exit and judge log-prob comes from the recorded "
     "traces; every time is modeled from their timing profiles"),
    ("decode step at batch B loaded to depth d = d x per-layer(B) + (1 + heads scored) x "
     "LM head(B), per-layer(B) = (full step - LM head) / layers, measured at batches 1-64; "
     "linear between, linearly extrapolated beyond"),
    ("a token costs every loaded layer wherever it exits (parallel decoding computes the "
     "skipped layers' KV in the next step) plus one vocabulary projection per exit head "
     "scored up to its exit: an exit saves latency, a shallower load saves work"),
    ("batch = the largest that fits the memory budget at the loaded depth (KV for prompt + "
     "answer tokens per request); the server is saturated, every batch full"),
    ("TTFT = the prompt pass at batch 1 through the loaded layers (+ a load stall); TPOT = "
     "the modeled step; loads move weights at the load bandwidth, the server stalls"),
    "a load or switch takes effect at the next request",
)


def say(msg: str) -> None:
    print(msg, flush=True)


def names(spec: str | None) -> list[str]:
    return [n.strip() for n in (spec or "").split(",") if n.strip()]


def run_helios(args) -> int:
    if not getattr(args, "sim", False):
        from services.bench.helios_live import run_live

        return run_live(args)
    from services.common import config as config_mod

    cfg = config_mod.load()
    models = names(getattr(args, "models", None)) or list(DEFAULT_MODELS)
    folder = Path(args.traces) if getattr(args, "traces", None) else cfg.home / "traces" / "helios"
    traces = ensure_traces(models, folder, cfg, args)
    if args.heads:
        traces = {n: keep_heads(t, list(t.head_layers[-1:]) if args.heads == "last" else
                                [int(k) for k in args.heads.split(",")])
                  for n, t in traces.items()}
    budget = int(args.budget_mb * MB) if getattr(args, "budget_mb", None) \
        else default_budget(traces, cfg.kv_budget_mb)
    first = next(iter(traces.values()))
    kinds = [p.kind for p in first.prompts]
    requests = args.requests or DEFAULT_REQUESTS
    drift = getattr(args, "drift_every", None) or DEFAULT_DRIFT
    stream = drifting_stream(kinds, requests, drift, args.seed)
    sim = SimConfig(threshold=args.threshold, memory_budget=budget,
                    ri=getattr(args, "ri", None) or RI,
                    load_ms_per_byte=load_cost(traces))
    say(f"helios replay: {', '.join(traces)}; {requests} requests drifting every {drift} "
        f"between {sorted(set(kinds))}; threshold {sim.threshold}, budget {budget / MB:.1f} MB, "
        f"RI {sim.ri}; loads at {sim.load_ms_per_byte * MB:.2f} ms/MB "
        f"({'measured' if sim.load_ms_per_byte != LOAD_MS_PER_BYTE else 'modeled'})")
    try:
        results = compare(traces, stream, sim)
    except ValueError as exc:  # e.g. a budget no candidate fits in: say so, no traceback
        raise SystemExit(f"error: {exc} (budget {budget / MB:.1f} MB, RI {sim.ri})") from None
    doc = report(traces, folder, stream, sim, results, {"requests": requests,
                                                         "drift_every": drift, "seed": args.seed})
    return write_outputs(doc, args, table, plot)


def write_outputs(doc: dict[str, Any], args, table, plot) -> int:
    """Print ``table(doc)``, write ``--json`` and the plot (``--plot``, else the JSON's name
    as SVG): the end of every ``bench helios`` run."""
    say(table(doc))
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    say(f"json: {args.json}")
    out = Path(args.plot) if getattr(args, "plot", None) else Path(args.json).with_suffix(".svg")
    say(f"plot: {plot(doc, out)}")
    return 0


# -- traces ----------------------------------------------------------------------------------


def trace_prompts(held: dict[str, list[str]], per_kind: int,
                  prompt_tokens: int) -> list[tuple[str, str]]:
    """(kind, text): the first ``per_kind`` held-out texts of each kind long enough for a
    prompt of ``prompt_tokens`` tokens under any tokenizer (the same for every candidate)."""
    out = []
    for kind, docs in held.items():
        long = [d for d in docs if len(d) >= CHARS_PER_TOKEN * prompt_tokens][:per_kind]
        if not long:
            raise SystemExit(f"error: no held-out {kind} text of {CHARS_PER_TOKEN * prompt_tokens}"
                             " characters: use a smaller --prompt-tokens")
        out += [(kind, d) for d in long]
    return out


def per_kind(args) -> int:
    return getattr(args, "trace_prompts", None) or PROMPTS_PER_KIND


def _wanted(t: CandidateTrace, args, judge: str) -> str | None:
    """Why ``t`` cannot serve this run (None: it can)."""
    if (t.new_tokens, t.prompt_tokens) != (args.max_tokens, args.prompt_tokens):
        return (f"was recorded with {t.prompt_tokens} prompt / {t.new_tokens} answer tokens, "
                f"asked {args.prompt_tokens} / {args.max_tokens}")
    if t.judge != judge:
        return f"was judged by {t.judge}, asked {judge}"
    counts = {k: sum(p.kind == k for p in t.prompts) for k in {p.kind for p in t.prompts}}
    if set(counts.values()) != {per_kind(args)}:
        return f"holds {counts} prompts per kind, asked {per_kind(args)}"
    return None


def ensure_traces(models: list[str], folder: Path, cfg, args) -> dict[str, CandidateTrace]:
    """Every model's trace from ``folder``, recording those missing or recorded otherwise."""
    from services.bench import helios_traces

    out: dict[str, CandidateTrace] = {}
    todo = []
    for name in models:
        path = folder / f"{name}.json.gz"
        if path.is_file():
            t = helios_traces.load(path)
            why = _wanted(t, args, getattr(args, "judge", None) or name)
            if why is None:
                say(f"trace of {name}: {path}")
                out[name] = t
                continue
            say(f"trace of {name} at {path} {why}: recording it again")
        todo.append(name)
    if todo:
        out.update(record_traces(todo, folder, cfg, args))
    out = {name: out[name] for name in models}
    try:
        check_traces(out)
    except ValueError as exc:  # e.g. this machine's held-out texts changed since
        say(f"{exc}: recording every trace again")
        out = record_traces(models, folder, cfg, args)
    return out


def prepared_dir(cfg, name: str) -> Path:
    path = cfg.models_dir / name
    if not (path / "manifest.json").is_file():
        raise SystemExit(f"error: {name} is not prepared in {cfg.models_dir}: run `offramp "
                         f"prepare {name}` first (HELIOS candidates are prepared generative "
                         "models, e.g. smollm2-135m, or tiny-llm in seconds)")
    return path


def record_traces(models: list[str], folder: Path, cfg, args) -> dict[str, CandidateTrace]:
    """Record the traces of ``models`` (one loaded at a time, and the judge if one is named)."""
    from services.bench import helios_traces
    from services.runtime.llm_model import load
    from services.zoo import llm_corpus

    dirs = {name: prepared_dir(cfg, name) for name in models}
    judge_name = getattr(args, "judge", None)
    judge = load(prepared_dir(cfg, judge_name), cfg.ort_threads) if judge_name else None
    say("loading the held-out prose and code for the trace prompts")
    corpus = llm_corpus.load_corpus(0, 0.2, cfg.home / "data")
    prompts = trace_prompts({k: corpus.held[k] for k in corpus.kinds}, per_kind(args),
                            args.prompt_tokens)
    out = {}
    for name in models:
        say(f"recording the trace of {name}: {len(prompts)} prompts x {args.max_tokens} tokens")
        llm = load(dirs[name], cfg.ort_threads)
        trace = helios_traces.record(llm, prompts, args.max_tokens, args.prompt_tokens,
                                     judge, log=say)
        path = helios_traces.save(trace, folder / f"{name}.json.gz")
        say(f"  {name}: {trace['meta']['seconds']:.1f} s -> {path}")
        out[name] = helios_traces.from_dict(trace)
        del llm
    return out


def keep_heads(t: CandidateTrace, layers: list[int]) -> CandidateTrace:
    """``t`` with only the exit heads at ``layers`` (the others are never evaluated)."""
    missing = sorted(set(layers) - set(t.head_layers))
    if missing:
        raise SystemExit(f"error: {t.name} has no exit head after layer(s) {missing}; its heads: "
                         f"{list(t.head_layers)}")
    prompts = tuple(replace(p, heads={k: h for k, h in p.heads.items() if k in layers})
                    for p in t.prompts)
    return replace(t, prompts=prompts)


def load_cost(traces: dict[str, CandidateTrace]) -> float:
    """ms per byte a load or switch takes: the slowest candidate's measured read of a layer
    from disk (greedy partial loading), else the modeled 10 GB/s."""
    measured = [t.layer_load_ms / t.layer_bytes for t in traces.values()
                if t.layer_load_ms is not None and t.layer_bytes > 0]
    return max(measured) if len(measured) == len(traces) else LOAD_MS_PER_BYTE


def default_budget(traces: dict[str, CandidateTrace], kv_budget_mb: float) -> int:
    """Choice: the largest candidate's full weights plus an LLM worker's KV budget
    (``OFFRAMP_KV_BUDGET_MB``): every candidate fits fully loaded."""
    weights = max(t.fixed_bytes + t.n_layers * t.layer_bytes for t in traces.values())
    return int(weights + kv_budget_mb * MB)


# -- report ----------------------------------------------------------------------------------


def report(traces: dict[str, CandidateTrace], folder: Path, stream: list[int], sim: SimConfig,
           results: dict, run: dict[str, Any]) -> dict[str, Any]:
    eq = equal_batch(results)
    kinds = [next(iter(traces.values())).prompts[p].kind for p in stream]
    return {
        "bench": "helios", "mode": "replay simulation from recorded traces",
        "traces_dir": str(folder), "models": list(traces),
        "traces": {n: {"judge": t.judge, "family": t.family, "n_layers": t.n_layers,
                       "head_layers": list(t.head_layers), "prompts": len(t.prompts),
                       "new_tokens": t.new_tokens, "prompt_tokens": t.prompt_tokens,
                       "layer_bytes": t.layer_bytes, "fixed_bytes": t.fixed_bytes,
                       "kv_bytes_per_token_layer": t.kv_bytes_per_token_layer,
                       "timing_measured": {"batches": list(t.timing.batches),
                                           "step_ms": list(t.timing.step_ms),
                                           "lm_head_ms": list(t.timing.lm_head_ms),
                                           "prefill_ms": t.timing.prefill_ms}}
                   for n, t in traces.items()},
        **run, "threshold": sim.threshold, "memory_budget_bytes": sim.memory_budget,
        "ri": sim.ri, "eval_prompts": sim.eval_prompts, "cbc_max": sim.cbc_max,
        "cbc_window": sim.cbc_window, "load_ms_per_byte": sim.load_ms_per_byte,
        "objective": sim.slo.objective, "modeled": ["tokens_per_s", "ttft_ms", "tpot_ms",
                                                    "time_ms", "transition_ms"],
        "choices": list(CHOICES), "stream_kinds": kinds, "equal_batch": eq,
        "policies": {name: r.to_dict(eq) for name, r in results.items()},
    }


def table(doc: dict[str, Any]) -> str:
    head = (f"\n{'policy (modeled times)':<26} {'tok/s':>9} {'TTFT ms':>8} {'TPOT ms':>8} "
            f"{'ppl':>8} {'agree':>7} {'batch':>6} {'MB/req@' + str(doc['equal_batch']):>10} "
            f"{'switch':>6} {'load':>5} {'moves ms':>9}")
    lines = [head]
    for name, p in doc["policies"].items():
        lines.append(f"{name:<26} {p['tokens_per_s']:>9.1f} {p['ttft_ms']:>8.2f} "
                     f"{p['tpot_ms']:>8.2f} {p['perplexity']:>8.3f} "
                     f"{100 * p['token_agreement']:>6.1f}% {p['largest_batch']:>6} "
                     f"{p['memory_per_request_at_equal_batch_bytes'] / MB:>10.3f} "
                     f"{p['switches']:>6} {p['loads']:>5} {p['transition_ms']:>9.2f}")
    judges = {t["judge"] for t in doc["traces"].values()}
    if len(judges) > 1:
        lines.append("perplexities are each candidate's own (compare only within one judge)")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Modeled tokens/s per request of every policy, the candidate and depth each HELIOS
    policy served at, and the stream's text kind (matplotlib when installed, else SVG)."""
    import numpy as np

    from services.bench.plot import save_panels

    x = np.arange(len(doc["stream_kinds"]), dtype=float)
    tps = [(n, x, np.array([s["tokens_per_s"] for s in p["timeline"]]))
           for n, p in doc["policies"].items()]
    depth_panels = []
    for pol in (p for p in HELIOS_POLICIES if p in doc["policies"]):
        tl = doc["policies"][pol]["timeline"]
        series = [(c, x, np.array([s["depth"] if s["candidate"] == c else np.nan for s in tl]))
                  for c in doc["models"]]
        depth_panels.append((f"{pol}: loaded depth, one line per candidate", series,
                             float(max(t["n_layers"] for t in doc["traces"].values()))))
    order = sorted(set(doc["stream_kinds"]))
    kind = [("kind", x, np.array([float(order.index(k)) for k in doc["stream_kinds"]]))]
    panels = [("modeled tokens/s", tps, max(float(y.max()) for _, _, y in tps) * 1.05),
              *depth_panels, (f"stream kind ({', '.join(f'{i}={k}' for i, k in enumerate(order))})",
                              kind, float(max(1, len(order) - 1)))]
    title = f"HELIOS replay ({doc['mode']}), threshold {doc['threshold']}"
    return save_panels(title, panels, "request", float(max(1, x.size)), path)
