"""HELIOS (pure): which early-exit LLM serves a prompt stream, and loaded how deep.

HELIOS (Kumar et al.; papers 003 and 004, Algorithm 1) keeps a few candidate early-exit LLMs
and serves with one of them at a time, loaded only up to the exit most tokens take:

1. **Top-k** (§3.3.1): from the model repository's offline profiles, the candidates that meet
   the SLO and fit the memory: :func:`select_top_k`.
2. **Evaluation** (§3.3.2, App. E): every RI requests the first prompts run on the candidates
   (their answers are returned, not discarded); tokens/s, TTFT, TPOT, perplexity and the exit
   distribution go into the Performance History Table (PHT): ``helios_schedule.ReassessSchedule``,
   :func:`exit_distribution`, :func:`perplexity`, :class:`PhtRow`. The best candidate at its
   likely depth then serves: :func:`choose_after_assessment`.
3. **Greedy loading** (§3.3.3): load up to :func:`greedy_depth`; the weights and KV cache of
   the layers not loaded become batch: :func:`max_batch`.
4. **Confidence breaches**: a token whose exit lies deeper than the loaded depth still leaves
   there (its prediction rarely changes, Insight 2) but counts as a breach;
   ``tuner.breach_counter.BreachCounter`` counts them over a sliding window and, when it breaches,
   :func:`load_or_switch` weighs loading the remaining layers against switching model.

A simulator replays recorded per-token exit layers through exactly these functions: a token
exiting at layer ``e`` under loaded depth ``d`` is a breach when ``e > d`` and costs
``min(e, d)`` layers. Units: bytes, milliseconds, tokens per second; layers are 1-based depths
(an exit after layer ``k`` reads the hidden state ``k`` layers in). Where the papers are vague
the docstrings say "Choice:".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from services.optimizer.helios_schedule import RI

TOP_K = 3  # 004 §3.3.1: "up to three models" (003 used two)
# Share of tokens the loaded depth must cover. Choice: the papers load "the layers most tokens
# need" and load 6 of OPT-1.3B's 24 layers when 74 % exit at 6 (a 0.9 quantile would load all
# 24). 0.5 also matches the CBC: at coverage >= 1 - CBC_MAX / CBC_WINDOW the profiled stream
# breaches no more than the counter tolerates.
GREEDY_Q = 0.5
# Tokens a load-or-switch decision is amortised over. Choice: half an RI of answers capped at
# 100 tokens (§4.3 of 003), i.e. the expected rest of the interval after a breach.
HORIZON_TOKENS = RI * 100 // 2
# Choice: a switch may cost at most 5 % perplexity (004 Table 8: HELIOS 1.62 vs 1.58-1.61).
PERPLEXITY_TOLERANCE = 0.05
OBJECTIVES = ("throughput", "accuracy", "latency")
EPS = 1e-9  # fractions summed from floats: 0.2 + 0.7 must reach 0.9


@dataclass(frozen=True)
class Candidate:
    """One early-exit LLM of the model repository with its offline profile.

    ``exit_layers`` ascend and end at ``n_layers`` (the final head). ``fixed_bytes`` stays
    resident at any depth (embedding, final norm, LM head, exit heads). ``tokens_per_s`` and
    ``perplexity`` are offline benchmark figures at full depth; ``exit_distribution`` is the
    offline ``{exit layer: fraction of tokens}``, empty when the repository has none (004
    §3.3.2: exit profiles are not in repositories by default). ``family`` names the tokenizer:
    perplexities compare only within one (004 App. A).
    """

    name: str
    family: str
    n_layers: int
    exit_layers: tuple[int, ...]
    layer_bytes: int
    fixed_bytes: int
    kv_bytes_per_token_layer: int
    tokens_per_s: float
    perplexity: float
    exit_distribution: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        exits = tuple(self.exit_layers) or (self.n_layers,)
        if self.n_layers < 1 or list(exits) != sorted(set(exits)) or exits[0] < 1 \
                or exits[-1] != self.n_layers:
            raise ValueError(f"{self.name}: exit layers {exits} must ascend to {self.n_layers}")
        if self.tokens_per_s <= 0 or min(self.layer_bytes, self.fixed_bytes) < 0:
            raise ValueError(f"{self.name}: tokens_per_s must be > 0 and bytes >= 0")
        object.__setattr__(self, "exit_layers", exits)

    @property
    def tpot_ms(self) -> float:
        """Offline time per output token."""
        return 1000.0 / self.tokens_per_s


@dataclass(frozen=True)
class PhtRow:
    """One PHT row: how ``candidate`` did in assessment ``assessment`` loaded to
    ``loaded_depth`` on the served text. ``exit_distribution`` maps exit layer -> fraction of
    tokens; tokens deeper than the loaded depth are counted at it (they left there)."""

    candidate: str
    assessment: int
    loaded_depth: int
    tokens_per_s: float
    ttft_ms: float
    tpot_ms: float
    perplexity: float
    exit_distribution: Mapping[int, float]
    memory_bytes: int
    tokens: int


@dataclass(frozen=True)
class Slo:
    """What the user asks for. ``objective`` ranks: throughput (tokens/s), accuracy
    (perplexity) or latency (TTFT; offline profiles have none, so top-k ranks it like
    throughput). ``family`` restricts the repository to one tokenizer.
    ``max_perplexity_rise``: a candidate meets the SLO only within this share of the lowest
    expected perplexity among those assessed (the acceptance's "within +5 % of the best
    single candidate"); None: no relative bound."""

    objective: str = "throughput"
    max_tpot_ms: float | None = None
    max_perplexity: float | None = None
    family: str | None = None
    max_perplexity_rise: float | None = PERPLEXITY_TOLERANCE

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective {self.objective!r} is not one of {OBJECTIVES}")


@dataclass(frozen=True)
class Decision:
    """What HELIOS does next: ``load`` more layers of the serving candidate, ``switch`` to
    ``candidate`` at ``depth``, or ``stay``; ``reason`` carries the numbers compared."""

    kind: str
    candidate: str
    depth: int
    reason: str
    load_bytes: int = 0
    load_ms: float = 0.0
    cost_ms: float = 0.0


# -- memory --------------------------------------------------------------------------------


def _check_depth(c: Candidate, depth: int) -> None:
    if not 1 <= depth <= c.n_layers:
        raise ValueError(f"{c.name}: depth {depth} outside 1..{c.n_layers}")


def weight_bytes(c: Candidate, depth: int) -> int:
    """Resident weights of ``c`` loaded to ``depth``."""
    _check_depth(c, depth)
    return c.fixed_bytes + depth * c.layer_bytes


def kv_bytes(c: Candidate, depth: int, tokens: int) -> int:
    """KV cache of one request holding ``tokens`` tokens at ``depth`` loaded layers."""
    _check_depth(c, depth)
    return depth * c.kv_bytes_per_token_layer * tokens


def max_batch(c: Candidate, depth: int, memory_budget: int, tokens_per_request: int) -> int:
    """Requests served at once by ``c`` loaded to ``depth`` within ``memory_budget`` (0 when
    the weights do not fit). Choice (004 §5.3): the weights count once, every request keeps
    KV for ``tokens_per_request`` tokens (prompt + answer) at each loaded layer; activations
    and allocator slack are not modelled (keep them out of the budget)."""
    if tokens_per_request < 1:
        raise ValueError("tokens_per_request must be >= 1")
    per_request = kv_bytes(c, depth, tokens_per_request)
    if per_request <= 0:
        raise ValueError(f"{c.name}: KV bytes per token and layer must be > 0")
    free = memory_budget - weight_bytes(c, depth)
    return max(0, free // per_request)


# -- exit distributions --------------------------------------------------------------------


def _normalised(distribution: Mapping[int, float]) -> list[tuple[int, float]]:
    """(layer, fraction) ascending by layer, fractions summing to 1; [] without mass."""
    total = sum(v for v in distribution.values() if v > 0)
    if total <= 0:
        return []
    return [(int(layer), max(0.0, v) / total) for layer, v in sorted(distribution.items())]


def greedy_depth(distribution: Mapping[int, float], n_layers: int, q: float = GREEDY_Q) -> int:
    """The smallest exit layer at or below which at least ``q`` of the tokens exit: load only
    up to the exit most tokens take. ``n_layers`` when the distribution is empty."""
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q}")
    covered = 0.0
    for layer, share in _normalised(distribution):
        if not 1 <= layer <= n_layers:
            raise ValueError(f"exit layer {layer} outside 1..{n_layers}")
        covered += share
        if covered >= q - EPS:
            return layer
    return n_layers


def coverage(distribution: Mapping[int, float], depth: int) -> float:
    """Share of tokens exiting at or below ``depth``; 1 - coverage is the breach rate."""
    return sum(share for layer, share in _normalised(distribution) if layer <= depth)


def mean_layers(distribution: Mapping[int, float], depth: int) -> float:
    """Layers a token traverses on average loaded to ``depth``: ``min(exit, depth)``. Without
    a distribution every token runs ``depth`` layers."""
    shares = _normalised(distribution)
    return sum(share * min(layer, depth) for layer, share in shares) if shares else float(depth)


def exit_distribution(exits: Iterable[int], depth: int | None = None) -> dict[int, float]:
    """``{exit layer: fraction}`` of per-token exit layers; with ``depth``, tokens exiting
    deeper are counted at ``depth`` (where a model loaded that deep let them leave)."""
    counts: dict[int, int] = {}
    for e in exits:
        layer = int(e) if depth is None else min(int(e), depth)
        counts[layer] = counts.get(layer, 0) + 1
    total = sum(counts.values())
    return {layer: n / total for layer, n in sorted(counts.items())}


def perplexity(logprobs: Sequence[float]) -> float:
    """exp(-mean natural-log probability) of the emitted tokens (004 App. A)."""
    if not logprobs:
        raise ValueError("perplexity of no tokens")
    return math.exp(-sum(logprobs) / len(logprobs))


# -- top-k -----------------------------------------------------------------------------------


def _rank_key(objective: str) -> Callable[[Candidate], tuple[float, float, str]]:
    if objective == "accuracy":
        return lambda c: (c.perplexity, -c.tokens_per_s, c.name)
    return lambda c: (-c.tokens_per_s, c.perplexity, c.name)


def select_top_k(candidates: Iterable[Candidate], slo: Slo, memory_budget: int,
                 k: int = TOP_K, tokens_per_request: int = 0,
                 q: float = GREEDY_Q) -> list[Candidate]:
    """Step 1: up to ``k`` candidates, best first, that fit ``memory_budget`` at their likely
    depth (greedy depth of the offline exit distribution, else full depth; weights plus the
    KV of one request of ``tokens_per_request`` tokens) and meet the SLO by their offline
    TPOT and perplexity. Ranked by offline tokens/s (accuracy: perplexity), ties by the other
    then name. Choice: only the best candidate's family is kept, so that the evaluation's
    perplexities compare (004 App. A restricts the repository to one tokenizer)."""
    eligible = []
    for c in candidates:
        depth = greedy_depth(c.exit_distribution, c.n_layers, q)
        if slo.family is not None and c.family != slo.family:
            continue
        if weight_bytes(c, depth) + kv_bytes(c, depth, tokens_per_request) > memory_budget:
            continue
        if slo.max_tpot_ms is not None and c.tpot_ms > slo.max_tpot_ms:
            continue
        if slo.max_perplexity is not None and c.perplexity > slo.max_perplexity:
            continue
        eligible.append(c)
    ranked = sorted(eligible, key=_rank_key(slo.objective))
    return [c for c in ranked if c.family == ranked[0].family][:k] if ranked else []


# -- what the PHT says about a candidate at a depth ----------------------------------------


def newest_rows(pht: Iterable[PhtRow], candidate: str) -> list[PhtRow]:
    """``candidate``'s rows of the newest assessment that measured it."""
    rows = [r for r in pht if r.candidate == candidate]
    newest = max((r.assessment for r in rows), default=None)
    return [r for r in rows if r.assessment == newest]


def reference_row(pht: Iterable[PhtRow], candidate: str) -> PhtRow | None:
    """The newest assessment's deepest row of ``candidate``: its exit distribution is the
    least truncated. Choice: evaluation runs candidates at full depth, since exits beyond the
    loaded depth cannot be observed (Algorithm 1 records both M and M' in the PHT)."""
    return max(newest_rows(pht, candidate), key=lambda r: r.loaded_depth, default=None)


def likely_depth(c: Candidate, pht: Iterable[PhtRow], q: float = GREEDY_Q) -> int:
    """Greedy depth of ``c`` from its PHT exit distribution, else its offline one."""
    ref = reference_row(pht, c.name)
    dist = ref.exit_distribution if ref is not None and ref.exit_distribution \
        else c.exit_distribution
    return greedy_depth(dist, c.n_layers, q)


def expected_tokens_per_s(c: Candidate, depth: int, pht: Iterable[PhtRow]) -> float:
    """Tokens/s of ``c`` loaded to ``depth``: a PHT row measured at that depth, else the
    reference row (else the offline profile at full depth) scaled by the layers a token
    traverses, ``mean_layers(ref) / mean_layers(depth)``. Choice: a token costs the layers it
    runs (``min(exit, depth)``, batch 1 as in 004 §5.1); fixed per-token work is ignored."""
    _check_depth(c, depth)
    rows = newest_rows(pht, c.name)
    exact = [r for r in rows if r.loaded_depth == depth]
    if exact:
        return exact[0].tokens_per_s
    ref = max(rows, key=lambda r: r.loaded_depth, default=None)
    tps, dist, ref_depth = (c.tokens_per_s, c.exit_distribution, c.n_layers) if ref is None \
        else (ref.tokens_per_s, ref.exit_distribution, ref.loaded_depth)
    return tps * mean_layers(dist, ref_depth) / mean_layers(dist, depth)


def expected_perplexity(c: Candidate, depth: int, pht: Iterable[PhtRow]) -> float:
    """Perplexity of ``c`` at ``depth``: measured there, else the reference row's, else the
    offline one. Choice: a shallower load is taken to keep the perplexity (Insight 2)."""
    rows = newest_rows(pht, c.name)
    exact = [r for r in rows if r.loaded_depth == depth]
    ref = exact[0] if exact else max(rows, key=lambda r: r.loaded_depth, default=None)
    return c.perplexity if ref is None else ref.perplexity


def expected_ttft_ms(c: Candidate, depth: int, pht: Iterable[PhtRow]) -> float | None:
    """TTFT at ``depth``: measured there, else the reference row's scaled by the depth (the
    prompt runs through every loaded layer); None without PHT rows."""
    rows = newest_rows(pht, c.name)
    exact = [r for r in rows if r.loaded_depth == depth]
    if exact:
        return exact[0].ttft_ms
    ref = max(rows, key=lambda r: r.loaded_depth, default=None)
    return None if ref is None else ref.ttft_ms * depth / ref.loaded_depth


# -- decisions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SwitchCosts:
    """Prices of a load-or-switch decision: ``load_ms_per_byte`` of weights moved into
    serving memory (measured, e.g. 1e-7 ms/byte at 10 GB/s), the ``horizon_tokens`` the
    choice is amortised over, and how much worse a switch target's perplexity may be."""

    load_ms_per_byte: float
    horizon_tokens: int = HORIZON_TOKENS
    perplexity_tolerance: float = PERPLEXITY_TOLERANCE
    q: float = GREEDY_Q


@dataclass(frozen=True)
class _Option:
    kind: str
    c: Candidate
    depth: int
    load_bytes: int
    load_ms: float
    run_ms: float
    tokens_per_s: float
    ppl: float

    @property
    def cost_ms(self) -> float:
        return self.load_ms + self.run_ms

    def text(self) -> str:
        return (f"{self.kind} {self.c.name}@{self.depth}: {self.load_bytes} B in "
                f"{self.load_ms:.1f} ms + {self.run_ms:.1f} ms at {self.tokens_per_s:.2f} "
                f"tok/s = {self.cost_ms:.1f} ms, ppl {self.ppl:.3f}")

    def decision(self, reason: str) -> Decision:
        return Decision(self.kind, self.c.name, self.depth, reason, self.load_bytes,
                        self.load_ms, self.cost_ms)


def _option(kind: str, c: Candidate, depth: int, load_bytes: int, pht: Sequence[PhtRow],
            costs: SwitchCosts) -> _Option:
    tps = expected_tokens_per_s(c, depth, pht)
    return _Option(kind, c, depth, load_bytes, load_bytes * costs.load_ms_per_byte,
                   costs.horizon_tokens * 1000.0 / tps, tps, expected_perplexity(c, depth, pht))


def _fits(c: Candidate, depth: int, memory_budget: int | None, tokens_per_request: int) -> bool:
    return memory_budget is None or max_batch(c, depth, memory_budget, tokens_per_request) >= 1


def load_or_switch(current: Candidate, depth: int, candidates: Sequence[Candidate],
                   pht: Sequence[PhtRow], costs: SwitchCosts, memory_budget: int | None = None,
                   tokens_per_request: int = 1) -> Decision:
    """What to do when the breach counter of ``current`` loaded to ``depth`` breaches.

    Options, each priced ``load_ms + horizon_tokens * 1000 / tokens_per_s``:

    - ``load``: the remaining ``n_layers - depth`` layers of ``current`` (Algorithm 1 loads
      the full model M, which meets every threshold); only its missing layers are moved.
    - ``switch``: another candidate at its likely depth, all of its weights moved; only when
      it fits the memory and its perplexity is within ``perplexity_tolerance`` of
      ``current``'s (Choice: the papers switch "while the perplexity remains similar").
    - ``stay``: only when ``current`` is already fully loaded (nothing left to load).

    The cheapest wins; a tie keeps ``current`` (load or stay before switch).
    """
    _check_depth(current, depth)
    full = current.n_layers
    own = _option("load", current, full, (full - depth) * current.layer_bytes, pht, costs) \
        if depth < full else _option("stay", current, depth, 0, pht, costs)
    options = [own] if _fits(current, own.depth, memory_budget, tokens_per_request) else []
    skipped = [] if options else [f"{own.kind} {current.name}@{own.depth}: does not fit"]
    bound = own.ppl * (1 + costs.perplexity_tolerance)
    for c in candidates:
        if c.name == current.name:
            continue
        d = likely_depth(c, pht, costs.q)
        if not _fits(c, d, memory_budget, tokens_per_request):
            skipped.append(f"switch {c.name}@{d}: does not fit")
            continue
        opt = _option("switch", c, d, weight_bytes(c, d), pht, costs)
        if opt.ppl > bound + EPS:
            skipped.append(f"switch {c.name}@{d}: ppl {opt.ppl:.3f} > {bound:.3f}")
            continue
        options.append(opt)
    head = f"breach at {current.name}@{depth}, {costs.horizon_tokens} tokens ahead"
    if not options:
        return Decision("stay", current.name, depth, "; ".join([head, *skipped, "no option"]))
    best = min(options, key=lambda o: o.cost_ms)
    lines = [head, *(o.text() for o in options), *skipped, f"-> {best.kind} {best.c.name}"]
    return best.decision("; ".join(lines))


def _objective_key(objective: str, tps: float, ppl: float, ttft: float | None,
                   name: str) -> tuple[float, float, str]:
    if objective == "accuracy":
        return (ppl, -tps, name)
    if objective == "latency":
        return (math.inf if ttft is None else ttft, -tps, name)
    return (-tps, ppl, name)


def choose_after_assessment(candidates: Sequence[Candidate], pht: Sequence[PhtRow], slo: Slo,
                            current: tuple[str, int] | None = None,
                            memory_budget: int | None = None, tokens_per_request: int = 1,
                            q: float = GREEDY_Q) -> Decision:
    """Algorithm 1's ``BestModel(PHT[M'])``: every candidate at its likely depth, estimated
    from the PHT; those that fit and meet the SLO (TPOT, perplexity) ranked by the objective.
    Choice: when none meets the SLO, the best of those that fit serves anyway (the reason
    says so). Relative to ``current`` (candidate, depth): same -> ``stay``, same candidate
    deeper -> ``load``, shallower -> ``unload``, another candidate -> ``switch``."""
    scored, figures = [], []
    for c in candidates:
        d = likely_depth(c, pht, q)
        if not _fits(c, d, memory_budget, tokens_per_request):
            continue
        tps, ppl = expected_tokens_per_s(c, d, pht), expected_perplexity(c, d, pht)
        key = _objective_key(slo.objective, tps, ppl, expected_ttft_ms(c, d, pht), c.name)
        scored.append((key, c, d, f"{c.name}@{d}: {tps:.2f} tok/s, ppl {ppl:.3f}"))
        figures.append((tps, ppl))
    bound = slo.max_perplexity
    if slo.max_perplexity_rise is not None and figures:
        rise = min(p for _, p in figures) * (1 + slo.max_perplexity_rise)
        bound = rise if bound is None else min(bound, rise)
    meets = [s for s, (tps, ppl) in zip(scored, figures, strict=True)
             if (slo.max_tpot_ms is None or 1000.0 / tps <= slo.max_tpot_ms + EPS)
             and (bound is None or ppl <= bound + EPS)]
    if not scored:
        raise ValueError("no candidate fits the memory budget")
    _, best, depth, _ = min(meets or scored, key=lambda s: s[0])
    note = "" if meets else "; no candidate meets the SLO, best effort"
    reason = f"assessment by {slo.objective}: " + "; ".join(s[3] for s in scored) + note
    if current is None or current[0] != best.name:
        kind, load = "switch", weight_bytes(best, depth)
    elif depth < current[1]:
        kind, load = "unload", 0  # the same candidate, its layers above depth released
    else:
        kind = "stay" if depth == current[1] else "load"
        load = (depth - current[1]) * best.layer_bytes
    return Decision(kind, best.name, depth, f"{reason} -> {best.name}@{depth}", load)
