"""E3's split/replica planner (§3.2, Fig. 6), pure: where to cut an early-exit model into
stages, on which device class each stage runs and with how many replicas.

The model (see :mod:`services.optimizer.block_costs` for the chain, the survival forecast
and latency interpolation):

- stages are contiguous blocks ``i..j``; a stage ends at a ramp site (its cut: exited
  samples leave there) or at the model's last block, so cuts are ramp sites. Every stage
  fuses its input back to the target batch ``B`` (E3 keeps the batch constant) and runs on
  ``m`` replicas of one device class. Inside a stage the batch shrinks at the running ramps
  (the paper's ``Σ_k P(k, B_k)`` with ``B_k`` the forecast batch at block ``k``), which is
  what lets the exit wrapper (:mod:`services.optimizer.exit_wrapper`) weigh a ramp's
  savings; ``T`` is the time of one fused batch through the stage.
- throughput, in samples entering the model per second: a stage entered by a fraction
  ``σ`` of the samples needs ``σ R / B`` batches a second, so its ``m`` replicas sustain
  ``m B / (T σ)`` (1000 × that with ``T`` in ms); the link after a stage carries one message
  of the batch's survivors per batch, ``fixed_ms + survivors × bytes × ms_per_byte``, one
  link per cut (the bus between two stage groups is one channel). Pipelined (§3.2.2), the
  plan sustains the minimum over stages and links; goodput = min(R, that).
  With ``Transfer.per_device`` every device has its own link instead (E3's cluster: a NIC
  per server), overlapped with its compute: a replica's cycle is the pipelined ``max`` of
  its batch time, sending its batch's survivors and receiving its fused input batch
  (``fixed_ms + B × bytes × ms_per_byte``), and no cut is a shared channel.
- worst-case latency of a sample = Σ over stages of (fill + T) + Σ transfers, where fill is
  the time to gather a batch: ``(B - 1) / (σ R)`` at the forecast arrival rate, capped by
  ``max_hold_ms`` (default: the SLO slack, ``slack × SLO``), after which the fusion sends a
  partial batch (below that rate the stage's capacity is not what binds). Constraint:
  latency ≤ SLO × (1 - slack).
- cost = Σ replicas × class cost per device-second / goodput × 1000 (per 1,000 answers);
  constraint: cost ≤ alpha × baseline. The baseline is vanilla serving: the full model
  without ramps, data-parallel on one class with the fewest replicas meeting R (the whole
  class when it cannot); of the classes, the best by goodput then cost. The same vanilla
  model (one stage, no ramp running) is a candidate plan, so E3 is never worse than it.
- objective: the most goodput, then the least cost, then the fewest stages (then the
  least latency).

Search (:mod:`services.optimizer.split_search`). The paper's recursion minimises the max
of stage cycles, but a latency budget and a cost cap do not decompose through a max, so the
min-max is solved parametrically. For a target goodput ``G`` every stage needs
``m = ceil(G / capacity per replica)`` replicas and every link a capacity ≥ G; the memo
``best[boundary][devices used per class]`` (boundary = model input, a cut, or the output;
one numpy array over the devices-used grid per boundary) then holds the least latency of a
prefix, built boundary by boundary. Target goodputs are R and every ``m × capacity`` and
link capacity below it: the goodput of any plan is one of them. Without the cost cap,
feasibility only gets easier as ``G`` falls, so a binary search finds the largest feasible
``G``. From there down, the first ``G`` whose table holds an entry within the cost cap is
the optimum, and its cheapest entry the least cost (latency does not depend on replicas;
a replica beyond the minimum only costs). Cost per answer is not monotone in ``G`` (one
replica less can make a lower goodput cheaper), so that descent prunes whole ranges of
targets by bounds instead of visiting each. A last pass, one stage per layer, finds the
fewest stages among the cheapest entries and traces the plan. One pass is
(options ≈ classes × boundaries² / 2) numpy operations on ``Π(count + 1)`` cells; a plan
takes one pass when the whole rate fits, about 15 when capacity binds, a few dozen when
the cost cap binds too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.optimizer.block_costs import LatencyTable, ModelChain, relative
from services.optimizer.exit_wrapper import RampChoice, stage_choices
from services.optimizer.split_search import EPS, Search, StageOption


@dataclass(frozen=True)
class DeviceClass:
    """``count`` devices of one kind, each costing ``cost_per_s`` per second."""

    name: str
    count: int
    latency: LatencyTable
    cost_per_s: float = 1.0

    def __post_init__(self) -> None:
        if self.count < 0 or not self.cost_per_s > 0:
            raise ValueError(f"class {self.name}: count >= 0 and cost_per_s > 0 required")


@dataclass(frozen=True)
class Transfer:
    """Moving survivors between stages: activation bytes per sample at each ramp site."""

    bytes_per_sample: tuple[float, ...]
    ms_per_byte: float = 0.0
    fixed_ms: float = 0.0  # per message
    per_device: bool = False  # False: one channel per cut; True: a link per device


@dataclass(frozen=True)
class Problem:
    """What to plan for: the model and its forecast, the inventory, the load and targets."""

    chain: ModelChain
    classes: tuple[DeviceClass, ...]
    rate: float  # requests per second
    slo_ms: float
    batch: int  # target batch of every stage
    slack: float = 0.2
    alpha: float = 1.0  # cost cap = alpha × baseline cost
    transfer: Transfer | None = None  # None: free
    max_hold_ms: float | None = None  # None: slack × slo_ms
    exit_wrapper: bool = True  # False: every ramp of a stage runs (§3.4 off)

    def __post_init__(self) -> None:
        if not (self.rate > 0 and self.slo_ms > 0 and self.batch >= 1 and self.alpha > 0):
            raise ValueError("rate, slo_ms and alpha must be positive, batch >= 1")
        if not 0.0 <= self.slack < 1.0:
            raise ValueError(f"slack must lie in [0, 1), got {self.slack}")
        if self.max_hold_ms is not None and not self.max_hold_ms >= 0:
            raise ValueError("max_hold_ms must be >= 0")
        if len({c.name for c in self.classes}) != len(self.classes):
            raise ValueError("device class names must be unique")
        for c in self.classes:
            self.chain.check_table(c.latency)
        n_sites = len(self.chain.ramp_after)
        t = self.transfer
        if t is not None and len(t.bytes_per_sample) != n_sites:
            raise ValueError(f"transfer needs bytes for each of the {n_sites} ramp sites")
        if t is not None and min(t.ms_per_byte, t.fixed_ms, *t.bytes_per_sample) < 0:
            raise ValueError("transfer costs must be non-negative")

    @property
    def latency_budget_ms(self) -> float:
        return self.slo_ms * (1.0 - self.slack)

    @property
    def hold_ms(self) -> float:
        return self.slack * self.slo_ms if self.max_hold_ms is None else self.max_hold_ms


@dataclass(frozen=True)
class Stage:
    """Blocks ``first_block..last_block`` on ``replicas`` devices of one class."""

    first_block: int
    last_block: int
    device_class: str
    replicas: int
    batch: int
    active_ramps: tuple[int, ...]  # ramp sites that run here; the cut last
    survival_in: float  # fraction of the model's samples that reach the stage
    ms: float  # one fused batch
    capacity: float  # samples entering the model per second its replicas sustain
    transfer_ms: float  # sending a batch's survivors to the next stage (0: last stage)


@dataclass(frozen=True)
class Baseline:
    """Vanilla data-parallel serving, what the cost cap is relative to."""

    device_class: str
    replicas: int
    goodput: float
    cost: float


@dataclass(frozen=True)
class DeploymentPlan:
    """The plan, or (``feasible=False``) why there is none; ``reason`` says which, in words."""

    feasible: bool
    reason: str
    stages: tuple[Stage, ...] = ()
    active_ramps: tuple[int, ...] = ()
    cuts: tuple[int, ...] = ()  # ramp sites where one stage hands over to the next
    goodput: float = 0.0  # expected, requests per second
    latency_ms: float = 0.0  # expected worst case
    cost: float = 0.0  # per 1,000 answers
    baseline: Baseline | None = None
    cost_cap: float = 0.0
    latency_budget_ms: float = 0.0


def baseline(p: Problem) -> Baseline | None:
    """Vanilla data-parallel serving (see the module docstring); None without devices."""
    best = None
    for c in p.classes:
        if c.count == 0:
            continue
        t = float(c.latency.blocks_at(p.batch).sum())
        per = 1000.0 * p.batch / t if t > 0 else math.inf
        m = min(c.count, max(1, math.ceil(p.rate / per - EPS)))
        g = min(p.rate, m * per)
        b = Baseline(c.name, m, g, m * c.cost_per_s * 1000.0 / g)
        if best is None or (-b.goodput, b.cost) < (-best.goodput, best.cost):
            best = b
    return best


@dataclass(frozen=True)
class StageCandidate:
    """One possible stage: its search option, its ramps and what the plan reports."""

    option: StageOption
    choice: RampChoice
    device_class: DeviceClass
    survival_in: float
    transfer_ms: float


def _vanilla(chain: ModelChain, table: LatencyTable, batch: int) -> RampChoice:
    ms = float(table.blocks_at(batch).sum())
    return RampChoice(0, chain.n_blocks - 1, (), tuple(range(len(chain.ramp_after))), ms)


def _candidate(p: Problem, u: int, v: int, axis: int, cls: DeviceClass, ch: RampChoice,
               cut: int | None, cut_in: int | None = None) -> StageCandidate:
    """Capacity, link and latency of one stage; ``cut``: the ramp site it ends at,
    ``cut_in``: the one it starts after."""
    s_in = p.chain.survival_in(ch.first_block)
    b, t = p.batch, p.transfer
    tx, rx, link = 0.0, 0.0, math.inf
    if cut is not None and t is not None:
        alive = b * relative(p.chain.survival[cut], s_in)  # one message: a batch's survivors
        tx = t.fixed_ms + alive * t.bytes_per_sample[cut] * t.ms_per_byte
        if not t.per_device:
            link = 1000.0 * b / (s_in * tx) if s_in * tx > 0 else math.inf
    if cut_in is not None and t is not None and t.per_device:
        rx = t.fixed_ms + b * t.bytes_per_sample[cut_in] * t.ms_per_byte
    cycle = max(ch.stage_ms, tx, rx) if t is not None and t.per_device else ch.stage_ms
    per = 1000.0 * b / (cycle * s_in) if cycle * s_in > 0 else math.inf
    arrivals = p.rate * s_in / 1000.0  # samples per ms at the forecast rate
    fill = 0.0 if b == 1 else min((b - 1) / arrivals if arrivals > 0 else math.inf, p.hold_ms)
    opt = StageOption(u, v, axis, fill + ch.stage_ms + tx, per, link)
    return StageCandidate(opt, ch, cls, s_in, tx)


def candidates(p: Problem) -> tuple[list[StageCandidate], list[int], list[DeviceClass]]:
    """Every possible stage of ``p``, the cut sites (boundary ``i`` ≥ 1 is after cut site
    ``i - 1``; the last boundary is the model's output) and the classes with devices."""
    chain, last_block = p.chain, p.chain.n_blocks - 1
    cuts = [s for s, a in enumerate(chain.ramp_after) if a < last_block]
    firsts = [0] + [chain.ramp_after[s] + 1 for s in cuts]
    end = len(firsts)
    boundary = {chain.ramp_after[s]: i + 1 for i, s in enumerate(cuts)} | {last_block: end}
    classes = [c for c in p.classes if c.count > 0]
    out = []
    for axis, c in enumerate(classes):
        for u, fb in enumerate(firsts):
            for lb, ch in stage_choices(chain, c.latency, fb, p.batch,
                                        keep_all=not p.exit_wrapper).items():
                v = boundary[lb]
                if u == 0 and v == end:  # the data-parallel full model: vanilla is a candidate
                    van = _vanilla(chain, c.latency, p.batch)
                    ch = van if van.stage_ms < ch.stage_ms * (1 - EPS) else ch
                out.append(_candidate(p, u, v, axis, c, ch, cuts[v - 1] if v < end else None,
                                      cuts[u - 1] if u > 0 else None))
    return out, cuts, classes


def _infeasible(p: Problem, reason: str, base: Baseline | None,
                cap: float = 0.0) -> DeploymentPlan:
    return DeploymentPlan(False, reason, baseline=base, cost_cap=cap,
                          latency_budget_ms=p.latency_budget_ms)


def plan(p: Problem) -> DeploymentPlan:
    """The best deployment of ``p`` (see the module docstring), or why there is none."""
    base = baseline(p)
    if base is None:
        return _infeasible(p, "no devices: every device class has count 0", None)
    cap = p.alpha * base.cost
    cands, cuts, classes = candidates(p)
    by_option = {c.option: c for c in cands}
    s = Search([c.option for c in cands], [c.count for c in classes],
               [c.cost_per_s for c in classes], len(cuts) + 1, p.latency_budget_ms)
    fastest = s.fastest()
    if fastest > s.budget:
        return _infeasible(p, f"latency: the fastest split takes {fastest:.2f} ms, over the "
                              f"budget of {p.latency_budget_ms:.2f} ms (SLO {p.slo_ms:g} ms "
                              f"less {p.slack:.0%} slack)", base, cap)
    floor = 1000.0 * s.cheapest_per_answer()
    if floor > cap * (1 + EPS):
        return _infeasible(p, _cost_reason(floor, cap, p.alpha, base, True), base, cap)
    targets = s.targets(p.rate)
    top = s.highest(targets)
    if top is None:
        return _infeasible(p, "inventory: no split within the latency budget fits the "
                              "devices available", base, cap)
    found = s.first_within(targets, top, len(targets) - 1, cap)
    if found is None:
        return _infeasible(p, _cost_reason(s.cheapest_seen(), cap, p.alpha, base), base, cap)
    g = float(targets[found])
    ok = s.feasible(g) & (1000.0 * s.rates / g <= cap * (1 + EPS))
    wanted = ok & (s.rates <= float(s.rates[ok].min()) * (1 + EPS))
    stages = [(by_option[o], m) for o, m in s.fewest_stages(g, wanted)]
    return _assemble(p, stages, base, cap)


def _cost_reason(cheapest: float, cap: float, alpha: float, base: Baseline,
                 bound: bool = False) -> str:
    said = "every split costs at least" if bound else "the cheapest examined costs"
    return (f"cost: no split within latency and inventory costs at most the cap of {cap:.4g} "
            f"per 1000 answers (alpha {alpha:g} x the vanilla baseline's {base.cost:.4g}); "
            f"{said} {cheapest:.4g}")


def _assemble(p: Problem, picked: list[tuple[StageCandidate, int]], base: Baseline,
              cap: float) -> DeploymentPlan:
    stages = tuple(Stage(c.choice.first_block, c.choice.last_block, c.device_class.name, m,
                         p.batch, c.choice.active, c.survival_in, c.choice.stage_ms,
                         m * c.option.per_replica, c.transfer_ms) for c, m in picked)
    limits = [(s.capacity, f"stage {i} ({s.device_class} x{s.replicas})")
              for i, s in enumerate(stages)]
    limits += [(c.option.link, f"the link after stage {i}") for i, (c, _m) in enumerate(picked)]
    capacity, bottleneck = min(limits, key=lambda t: t[0])
    goodput = min(p.rate, capacity)
    rate = sum(m * c.device_class.cost_per_s for c, m in picked)
    cost = 1000.0 * rate / goodput
    latency = sum(c.option.latency_ms for c, _m in picked)
    held = f"meets the rate {p.rate:g} req/s" if capacity >= p.rate * (1 - EPS) else \
        f"{goodput:.4g} of {p.rate:g} req/s, bound by {bottleneck}"
    reason = (f"{len(stages)} stage(s) {held}; cost {cost:.4g} per 1000 answers (cap "
              f"{cap:.4g}, vanilla {base.cost:.4g}); worst-case latency {latency:.2f} of "
              f"{p.latency_budget_ms:.2f} ms")
    return DeploymentPlan(True, reason, stages,
                          tuple(r for s in stages for r in s.active_ramps),
                          tuple(s.active_ramps[-1] for s in stages[:-1]),
                          goodput, latency, cost, base, cap, p.latency_budget_ms)
