"""HELIOS replay (pure): recorded per-token exit traces of candidate early-exit LLMs, replayed
as a drifting prompt stream through the very decision code HELIOS serves with:
``optimizer.helios`` (top-k, ``choose_after_assessment``, greedy depth, ``load_or_switch``,
``max_batch``), ``optimizer.helios_schedule.ReassessSchedule`` and ``tuner.breach_counter``.

Traces (``services.sim.helios_trace``; ``services.bench.helios_traces`` records them, one per
candidate) hold, per prompt and generated token, each exit head's confidence, argmax token
and the judge's log-prob of it. Under loaded depth ``d`` a token whose *needed* layer (first
confident head, else ``n_layers``) is ``e`` exits at ``min(e, d)`` (``d`` is always an exit
layer), serves that layer's token and is a confidence breach when ``e > d``.

Policies: ``alone:<candidate>`` (fully loaded, exits at the threshold: EE-LLM style),
``helios``, ``helios-no-switch`` (only the first assessment picks a candidate; later ones and
breaches only load or unload its layers), ``helios-no-greedy`` (always fully loaded, switches
at assessments; a fully loaded model never breaches).

Modeled, never measured here (units: ms, bytes, tokens/s):

- Batch: the largest that fits the memory budget at the loaded depth (``helios.max_batch``,
  KV for ``prompt_tokens + new_tokens`` per request). Choice: the server is saturated, so
  every batch is full.
- Decode step at batch ``B`` loaded to depth ``d``: ``d * per_layer(B) + (1 + H) *
  fixed(B)``; ``fixed`` is the measured LM head, ``per_layer`` is (full step - LM head) /
  n_layers, ``H`` the mean number of exit heads a token is scored by (every head up to the
  one it leaves at: each projects onto the vocabulary like the LM head). Choice: a token costs
  every loaded layer, wherever it exits: parallel decoding computes the skipped layers' KV
  in the next step (``runtime.llm_decoder``), so an exit saves latency, not work, and only a
  shallower load saves work. The policy's own estimate (``helios.expected_tokens_per_s``,
  batch 1 as in 004 §5.1) charges ``min(exit, d)`` instead; the replay is the truth it is
  judged by. Between measured batch sizes linear interpolation; Choice: beyond the largest
  measured batch, linear extrapolation from the last two (slope >= 0).
- A request of ``N`` tokens takes its prompt's prefill (batch 1 at the loaded depth:
  ``fixed(1) + d * (prefill - fixed(1)) / n_layers``) plus ``N * step / B`` (its share of
  the batch's steps). TTFT = prefill (+ any load stall just before it); TPOT = step.
- Loads and switches move weights at ``load_ms_per_byte`` (default 10 GB/s): only the missing
  layers of the same candidate, all resident weights of another. Choice: the server stalls
  for them; the first configuration is loaded before the stream starts, free.
- Choice: a decision (breach or assessment) takes effect at the next request; the current
  request ends on its configuration (switching mid-request would re-prefill its text).
- Evaluation (every ``ri`` requests, ``eval_prompts`` per candidate, answers returned) runs
  each candidate fully loaded; its rows (tokens/s, TTFT, TPOT, perplexity, exit distribution
  over all layers) go into the PHT. Offline repository figures for top-k: full-depth
  tokens/s at batch 1, the full model's perplexity over the whole trace, no exit
  distribution (004 §3.3.2: repositories have none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from services.optimizer.helios import (
    GREEDY_Q,
    HORIZON_TOKENS,
    PERPLEXITY_TOLERANCE,
    TOP_K,
    Candidate,
    PhtRow,
    Slo,
    SwitchCosts,
    choose_after_assessment,
    exit_distribution,
    kv_bytes,
    load_or_switch,
    max_batch,
    perplexity,
    select_top_k,
    weight_bytes,
)
from services.optimizer.helios_schedule import EVAL_PROMPTS, RI, ReassessSchedule
from services.sim.helios_trace import CandidateTrace, check_traces
from services.tuner.breach_counter import CBC_MAX, CBC_WINDOW, BreachCounter

HELIOS = "helios"
NO_SWITCH = "helios-no-switch"
NO_GREEDY = "helios-no-greedy"
HELIOS_POLICIES = (HELIOS, NO_SWITCH, NO_GREEDY)
ALONE = "alone:"
LOAD_MS_PER_BYTE = 1e-7  # 10 GB/s host-to-device


# -- configuration and results ---------------------------------------------------------------


@dataclass(frozen=True)
class SimConfig:
    """Threshold (top probability), memory budget (bytes) and HELIOS's parameters."""

    threshold: float
    memory_budget: int
    ri: int = RI
    eval_prompts: int = EVAL_PROMPTS
    load_ms_per_byte: float = LOAD_MS_PER_BYTE
    cbc_max: int = CBC_MAX
    cbc_window: int = CBC_WINDOW
    slo: Slo = field(default_factory=Slo)
    q: float = GREEDY_Q
    horizon_tokens: int = HORIZON_TOKENS
    perplexity_tolerance: float = PERPLEXITY_TOLERANCE
    top_k: int = TOP_K

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1 or self.memory_budget <= 0 or self.load_ms_per_byte < 0:
            raise ValueError("need 0 < threshold <= 1, memory_budget > 0, load cost >= 0")


@dataclass(frozen=True)
class Event:
    """A change of what is loaded. ``cause``: evaluate, assess or breach; ``action``
    relative to the serving choice before (assess, breach) or to what was resident
    (evaluate): start, switch, load, unload or stay; bytes moved and the stall (ms)."""

    request: int
    cause: str
    action: str
    candidate: str
    depth: int
    load_bytes: int
    cost_ms: float
    reason: str = ""


@dataclass(frozen=True)
class Served:
    """One request of the timeline, with its modeled figures."""

    request: int
    kind: str
    candidate: str
    depth: int
    batch: int
    evaluation: bool
    tokens: int
    mean_layers: float
    tokens_per_s: float
    ttft_ms: float
    tpot_ms: float
    breaches: int
    agreement: float
    weight_bytes: int
    kv_bytes: int


@dataclass
class PolicyResult:
    """What one policy did over the stream (all times modeled)."""

    policy: str
    timeline: list[Served] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    serve_ms: float = 0.0
    transition_ms: float = 0.0
    logprob_sum: float = 0.0
    agree: int = 0

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.timeline)

    def count(self, action: str) -> int:
        """Decisions (assessments, breaches) that switched candidate or loaded layers."""
        return sum(e.action == action and e.cause != "evaluate" for e in self.events)

    def summary(self, equal_batch: int) -> dict:
        """The figures one row of the table shows; memory of the served configurations at a
        batch every policy reaches (``equal_batch``), per request."""
        tl, n = self.timeline, max(1, len(self.timeline))
        tokens = self.tokens
        mem = sum(s.weight_bytes + equal_batch * s.kv_bytes for s in tl) / n
        return {"tokens": tokens, "requests": len(tl),
                "time_ms": self.serve_ms + self.transition_ms,
                "tokens_per_s": tokens * 1000.0 / max(1e-12, self.serve_ms + self.transition_ms),
                "ttft_ms": sum(s.ttft_ms for s in tl) / n, "tpot_ms": sum(s.tpot_ms for s in tl) / n,
                "perplexity": math.exp(-self.logprob_sum / tokens) if tokens else None,
                "token_agreement": self.agree / tokens if tokens else None,
                "largest_batch": max((s.batch for s in tl), default=0),
                "mean_batch": sum(s.batch for s in tl) / n,
                "mean_layers": sum(s.mean_layers * s.tokens for s in tl) / max(1, tokens),
                "breaches": sum(s.breaches for s in tl),
                "peak_weight_bytes": max((s.weight_bytes for s in tl), default=0),
                "kv_bytes_per_request": sum(s.kv_bytes for s in tl) / n,
                "equal_batch": equal_batch, "memory_at_equal_batch_bytes": mem,
                "memory_per_request_at_equal_batch_bytes": mem / max(1, equal_batch),
                "switches": self.count("switch"), "loads": self.count("load"),
                "decision_move_ms": sum(e.cost_ms for e in self.events
                                        if e.cause in ("assess", "breach")),
                "evaluation_moves": sum(e.cause == "evaluate" and e.load_bytes > 0
                                        for e in self.events),
                "evaluation_move_ms": sum(e.cost_ms for e in self.events
                                          if e.cause == "evaluate"),
                "transition_ms": self.transition_ms}

    def to_dict(self, equal_batch: int) -> dict:
        return {**self.summary(equal_batch), "events": [asdict(e) for e in self.events],
                "timeline": [asdict(s) for s in self.timeline]}


# -- one policy's replay ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Outcome:
    """One served request: its row, per-token exit layers and judge log-probs, its serving
    time (ms, without stalls) and whether the breach counter breached during it."""

    row: Served
    exits: list[int]
    logprobs: list[float]
    time_ms: float
    breached: bool


@dataclass
class _Eval:
    """An evaluation phase's requests on one candidate, for its PHT row."""

    exits: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    served: list[Served] = field(default_factory=list)
    time_ms: float = 0.0


class _Replay:
    """Mutable state of one policy over the stream: what is resident, the stall the next
    request waits for, and the result being filled."""

    def __init__(self, policy: str, traces: Mapping[str, CandidateTrace], cfg: SimConfig):
        self.traces, self.cfg = traces, cfg
        self.cands = {n: t.candidate() for n, t in traces.items()}
        self.tpr = next(iter(traces.values())).tokens_per_request
        self.resident: tuple[str, int] | None = None
        self.stall_ms = 0.0
        self.result = PolicyResult(policy)
        self._needed: dict[tuple[str, int], tuple[int, ...]] = {}
        self.costs = SwitchCosts(cfg.load_ms_per_byte, cfg.horizon_tokens,
                                 cfg.perplexity_tolerance, cfg.q)

    def move(self, n: int, name: str, depth: int, cause: str, action: str | None = None,
             reason: str = "") -> None:
        """Make ``name`` loaded to ``depth`` resident, paying for the bytes it lacks."""
        if self.resident == (name, depth) and action is None:
            return
        c = self.cands[name]
        if self.resident is None:
            moved = 0
        elif self.resident[0] == name:
            moved = max(0, depth - self.resident[1]) * c.layer_bytes
        else:
            moved = weight_bytes(c, depth)
        cost = moved * self.cfg.load_ms_per_byte
        if action is None:
            action = "start" if self.resident is None else _action(self.resident, name, depth)
        self.result.events.append(Event(n, cause, action, name, depth, moved, cost, reason))
        self.result.transition_ms += cost
        self.stall_ms += cost
        self.resident = (name, depth)

    def needed(self, name: str, p: int) -> tuple[int, ...]:
        key = (name, p)
        if key not in self._needed:
            t = self.traces[name]
            self._needed[key] = t.prompts[p].needed(self.cfg.threshold, t.n_layers)
        return self._needed[key]

    def serve(self, n: int, p: int, evaluation: bool,
              counter: BreachCounter | None = None) -> _Outcome:
        """Request ``n`` (prompt ``p``) on the resident configuration; ``counter`` sees its
        tokens' breaches until it breaches."""
        assert self.resident is not None
        name, depth = self.resident
        t, c = self.traces[name], self.cands[name]
        prompt, need = t.prompts[p], self.needed(name, p)
        exits = [min(e, depth) for e in need]
        picks = [prompt.served(i, e) for i, e in enumerate(exits)]
        agree = sum(tok == full for (tok, _), full in zip(picks, prompt.full_token, strict=True))
        flags = [e > depth for e in need]
        batch = max_batch(c, depth, self.cfg.memory_budget, self.tpr)
        if batch < 1:
            raise ValueError(f"{name}@{depth} does not fit the memory budget")
        layers = sum(exits) / len(exits)
        heads = sum(sum(1 for h in t.head_layers if h <= e) for e in exits) / len(exits)
        tpot = t.timing.step(depth, batch) + heads * t.timing.fixed_ms(batch)
        prefill = t.timing.prefill(depth)
        ttft, self.stall_ms = prefill + self.stall_ms, 0.0
        time_ms = prefill + len(exits) * tpot / batch
        row = Served(n, prompt.kind, name, depth, batch, evaluation, len(exits), layers,
                     batch * 1000.0 / tpot, ttft, tpot, sum(flags), agree / len(exits),
                     weight_bytes(c, depth), kv_bytes(c, depth, self.tpr))
        r = self.result
        r.timeline.append(row)
        r.serve_ms += time_ms
        r.logprob_sum += sum(lp for _, lp in picks)
        r.agree += agree
        breached = counter is not None and counter.first_breach(flags) is not None
        return _Outcome(row, exits, [lp for _, lp in picks], time_ms, breached)


def _action(before: tuple[str, int] | None, name: str, depth: int) -> str:
    if before is None:
        return "start"
    if before[0] != name:
        return "switch"
    return "load" if depth > before[1] else "unload" if depth < before[1] else "stay"


def _pht_rows(evals: Mapping[str, _Eval], assessment: int,
              cands: Mapping[str, Candidate]) -> list[PhtRow]:
    rows = []
    for name, ev in evals.items():
        s, tokens = ev.served, len(ev.exits)
        rows.append(PhtRow(name, assessment, cands[name].n_layers,
                           tokens * 1000.0 / ev.time_ms, sum(x.ttft_ms for x in s) / len(s),
                           sum(x.tpot_ms for x in s) / len(s), perplexity(ev.logprobs),
                           exit_distribution(ev.exits),
                           max(x.weight_bytes + x.batch * x.kv_bytes for x in s), tokens))
    return rows


def _run_alone(rp: _Replay, stream: Sequence[int], name: str) -> None:
    if name not in rp.cands:
        raise ValueError(f"no trace of {name!r}: have {sorted(rp.cands)}")
    rp.move(0, name, rp.cands[name].n_layers, "start")
    for n, p in enumerate(stream):
        rp.serve(n, p, False)


def _assess(rp: _Replay, n: int, pool: list[Candidate], pht: list[PhtRow], variant: str,
            chosen: tuple[str, int] | None) -> tuple[str, int]:
    """Algorithm 1's BestModel(PHT[M']) at the end of an evaluation phase. Without greedy
    loading the PHT's exit distributions are hidden, so every candidate ranks fully loaded."""
    view = [replace(r, exit_distribution={}) for r in pht] if variant == NO_GREEDY else pht
    d = choose_after_assessment(pool, view, rp.cfg.slo, rp.resident, rp.cfg.memory_budget,
                                rp.tpr, rp.cfg.q)
    depth = rp.cands[d.candidate].n_layers if variant == NO_GREEDY else d.depth
    rp.move(n, d.candidate, depth, "assess", _action(chosen, d.candidate, depth), d.reason)
    return d.candidate, depth


def _on_breach(rp: _Replay, n: int, chosen: tuple[str, int], pool: list[Candidate],
               pht: list[PhtRow], variant: str) -> tuple[str, int]:
    current = rp.cands[chosen[0]]
    options = [current] if variant == NO_SWITCH else pool
    d = load_or_switch(current, chosen[1], options, pht, rp.costs, rp.cfg.memory_budget, rp.tpr)
    rp.move(n, d.candidate, d.depth, "breach", _action(chosen, d.candidate, d.depth), d.reason)
    return d.candidate, d.depth


def _run_helios(rp: _Replay, stream: Sequence[int], variant: str) -> None:
    cfg = rp.cfg
    pool = select_top_k(rp.cands.values(), cfg.slo, cfg.memory_budget, cfg.top_k, rp.tpr, cfg.q)
    if not pool:
        raise ValueError("no candidate fits the memory budget with one request")
    counter = BreachCounter(cfg.cbc_max, cfg.cbc_window)
    pht: list[PhtRow] = []
    evals: dict[str, _Eval] = {}
    chosen: tuple[str, int] | None = None
    schedule = ReassessSchedule(tuple(c.name for c in pool), cfg.ri, cfg.eval_prompts)
    for n, p in enumerate(stream):
        if n % cfg.ri == 0:  # an assessment starts: Algorithm 1 resets the CBC
            counter.reset()
            evals = {}
            schedule = ReassessSchedule(tuple(c.name for c in pool), cfg.ri, cfg.eval_prompts)
        if n % cfg.ri == schedule.phase_length:
            pht += _pht_rows(evals, schedule.assessment(n), rp.cands)
            chosen = _assess(rp, n, pool, pht, variant, chosen)
            if variant == NO_SWITCH:
                pool = [rp.cands[chosen[0]]]
        if on := schedule.eval_candidates(n):
            rp.move(n, on[0], rp.cands[on[0]].n_layers, "evaluate")
            out = rp.serve(n, p, True)
            ev = evals.setdefault(on[0], _Eval())
            ev.exits += out.exits
            ev.logprobs += out.logprobs
            ev.served.append(out.row)
            ev.time_ms += out.time_ms
            continue
        assert chosen is not None and rp.resident == chosen
        if rp.serve(n, p, False, counter).breached:
            chosen = _on_breach(rp, n, chosen, pool, pht, variant)
            counter.reset()


def simulate(policy: str, traces: Mapping[str, CandidateTrace], stream: Sequence[int],
             cfg: SimConfig) -> PolicyResult:
    """Replay ``stream`` (prompt indices) under ``policy``."""
    check_traces(traces)
    n_prompts = len(next(iter(traces.values())).prompts)
    if not stream or any(not 0 <= p < n_prompts for p in stream):
        raise ValueError(f"the stream must be prompt indices in 0..{n_prompts - 1}")
    rp = _Replay(policy, traces, cfg)
    if policy.startswith(ALONE):
        _run_alone(rp, stream, policy[len(ALONE):])
    elif policy in HELIOS_POLICIES:
        _run_helios(rp, stream, policy)
    else:
        raise ValueError(f"unknown policy {policy!r}: alone:<candidate> or {HELIOS_POLICIES}")
    return rp.result


def policies_for(traces: Mapping[str, CandidateTrace]) -> list[str]:
    return [f"{ALONE}{name}" for name in traces] + list(HELIOS_POLICIES)


def compare(traces: Mapping[str, CandidateTrace], stream: Sequence[int], cfg: SimConfig,
            policies: Sequence[str] | None = None) -> dict[str, PolicyResult]:
    """Every policy over the same stream."""
    return {p: simulate(p, traces, stream, cfg) for p in (policies or policies_for(traces))}


def equal_batch(results: Mapping[str, PolicyResult]) -> int:
    """A batch every policy reaches: the smallest of their largest batches (at least 1)."""
    return max(1, min((max((s.batch for s in r.timeline), default=1)
                       for r in results.values()), default=1))
