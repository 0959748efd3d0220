"""The three policies of ``offramp bench e3 --sim`` and the workload they serve, pure.

Given a model chain (blocks, ramp sites, forecast survival), a device class's latency table
and a number of devices, this builds the :class:`~services.sim.e3_sim.Pipeline` of

- ``vanilla``: the full model without ramps, data-parallel on every device;
- ``naive_ee``: compute mode with every useful ramp (the ramps the exit config lets
  samples out at) in one stage, data-parallel on every device: the batch shrinks through
  the model as samples exit, the way an early-exit model is batched without E3;
- ``e3``: the optimizer's plan (``services.optimizer.splits.plan``, the caller times it):
  stages cut at ramps, replicas per stage, the exit wrapper's ramps, transfers between
  stages, fusion in front of every later stage.

Workload (how the bench builds its streams from a trace, E3 §5 "easy"/"hard" inputs):

- a sample's exit under the exit config with every useful ramp active is the first ramp
  whose score passes its threshold (:func:`~services.sim.e3_sim.exit_sites`);
- it is **easy** when that ramp sits in the first half of the model by cost: the
  batch-1 time of the blocks up to the ramp is at most half of the whole model's
  (:func:`easy_mask`); every other sample (a later ramp, or the final layer) is **hard**;
- in a stream with easy fraction ``f`` each request is easy with probability ``f`` and
  is then drawn from the easy pool, else from the hard pool, uniformly with replacement
  (:func:`mix_stream`, seeded; a shorter stream is a prefix of a longer one).

Modeled device classes (:func:`modeled_table`): a measured table's blocks and heads scaled,
batch size by batch size, by the ratio of a reference device's whole-model batch curve to
this machine's whole-model curve. Nothing here is measured on that device: callers label
the class as modeled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from services.optimizer.block_costs import LatencyTable, ModelChain, stage_ms
from services.optimizer.splits import DeploymentPlan, DeviceClass, Problem, Transfer
from services.profiler.batch_profile import survival
from services.sim.e3_sim import FINAL, Pipeline, StageSpec

POLICIES = ("vanilla", "naive_ee", "e3")
EASY_HALF = 0.5  # an easy sample exits where at most this share of the model's cost is spent


# ------------------------------------------------------------------ device classes


def modeled_table(measured: LatencyTable, measured_full: Mapping[int, float],
                  reference_full: Mapping[int, float]) -> tuple[LatencyTable, dict[int, float]]:
    """``measured`` with every block and head scaled at each of its batch sizes ``b`` by
    ``reference_full(b) / measured_full(b)`` (whole-model times, ms). The reference curve
    is interpolated linearly where it lacks a size (and must cover the table's range).
    Returns the modeled table and the ratio used at each batch size."""
    sizes = measured.batch_sizes
    ref_b = np.array(sorted(reference_full), dtype=np.float64)
    ref_ms = np.array([reference_full[int(b)] for b in ref_b], dtype=np.float64)
    if sizes[0] < ref_b[0] or sizes[-1] > ref_b[-1]:
        raise ValueError(f"the reference curve covers batches {ref_b[0]:g}-{ref_b[-1]:g}, the "
                         f"table {sizes[0]}-{sizes[-1]}")
    missing = [b for b in sizes if b not in measured_full]
    if missing:
        raise ValueError(f"no measured whole-model time at batch sizes {missing}")
    ratio = {b: float(np.interp(b, ref_b, ref_ms)) / measured_full[b] for b in sizes}
    r = np.array([ratio[b] for b in sizes])
    return LatencyTable(sizes, measured.block_ms * r, measured.head_ms * r), ratio


def full_ms(table: LatencyTable, batch: int) -> float:
    """The whole model without ramps at ``batch`` on ``table``: what vanilla pays."""
    return float(table.blocks_at(batch).sum())


def default_slo_ms(table: LatencyTable, factor: float = 10.0, batch: int = 16) -> float:
    """The bench's default SLO: ``factor`` x the batch-16 full-model time on the class."""
    return factor * full_ms(table, batch)


# ------------------------------------------------------------------ workload


def site_cost_fraction(table: LatencyTable, ramp_after: Sequence[int]) -> np.ndarray:
    """Per ramp site: share of the whole model's batch-1 block time spent up to it."""
    cum = np.cumsum(table.blocks_at(1))
    return np.array([cum[a] / cum[-1] for a in ramp_after]) if len(ramp_after) else np.zeros(0)


def easy_mask(exit_site: np.ndarray, cost_fraction: np.ndarray,
              half: float = EASY_HALF) -> np.ndarray:
    """Easy samples: they exit at a ramp within the first ``half`` of the model's cost."""
    e = np.asarray(exit_site, dtype=np.int64)
    frac = np.append(cost_fraction, np.inf)  # FINAL (-1) reads the inf: never easy
    return (e != FINAL) & (frac[e] <= half)


def mix_stream(easy: np.ndarray, hard: np.ndarray, easy_frac: float, n: int,
               seed: int) -> np.ndarray:
    """``n`` sample indices: each request is easy with probability ``easy_frac`` and then
    drawn from ``easy``, else from ``hard`` (uniform, with replacement). Three generators
    seeded from ``seed`` draw the class and the two pools' picks, so the stream of a
    smaller ``n`` is a prefix of a larger one's."""
    if not 0.0 <= easy_frac <= 1.0 or n < 0:
        raise ValueError("easy_frac must lie in [0, 1] and n >= 0")
    if (easy_frac > 0 and not len(easy)) or (easy_frac < 1 and not len(hard)):
        raise ValueError("the mix needs samples from an empty pool (easy or hard)")
    g_class, g_easy, g_hard = (np.random.default_rng([seed, k]) for k in range(3))
    is_easy = g_class.random(n) < easy_frac
    e = np.asarray(easy, dtype=np.int64)
    h = np.asarray(hard, dtype=np.int64)
    pick_e = e[g_easy.integers(0, e.size, n)] if e.size else np.zeros(n, np.int64)
    pick_h = h[g_hard.integers(0, h.size, n)] if h.size else np.zeros(n, np.int64)
    return np.where(is_easy, pick_e, pick_h)


def parse_mix(text: str) -> float:
    """"80/20" -> 0.8, the easy fraction."""
    try:
        easy, hard = (float(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"a mix is EASY/HARD in percent, e.g. 80/20, got {text!r}") from None
    if easy < 0 or hard < 0 or not math.isclose(easy + hard, 100.0):
        raise ValueError(f"a mix's two shares must add up to 100, got {text!r}")
    return easy / 100.0


def window_survival(exits: np.ndarray, n_sites: int, windows: int) -> list[tuple[float, ...]]:
    """Survival after every site in each of ``windows`` consecutive equal-count chunks of
    the stream (``batch_profile.survival``: what the profiler observes per window)."""
    chunks = np.array_split(np.asarray(exits, dtype=np.int64), windows)
    return [survival(c, list(range(n_sites))) for c in chunks if c.size]


# ------------------------------------------------------------------ pipelines


def vanilla_pipeline(table: LatencyTable, ramp_after: tuple[int, ...], devices: int,
                     batch: int, device_class: str = "", cost_per_s: float = 1.0) -> Pipeline:
    last = table.n_blocks - 1
    st = StageSpec(0, last, (), devices, batch, table, full_ms(table, batch), device_class,
                   cost_per_s)
    return Pipeline("vanilla", (st,), ramp_after)


def naive_pipeline(chain: ModelChain, table: LatencyTable, sites: tuple[int, ...],
                   devices: int, batch: int, device_class: str = "",
                   cost_per_s: float = 1.0) -> Pipeline:
    """Every site of ``sites`` runs in one stage over the whole model on every device; the
    expected batch time is the planner's (the batch shrinking by the forecast survival)."""
    last = chain.n_blocks - 1
    expected = stage_ms(chain, table, 0, last, batch, sites)
    st = StageSpec(0, last, tuple(sorted(sites)), devices, batch, table, expected,
                   device_class, cost_per_s)
    return Pipeline("naive_ee", (st,), chain.ramp_after)


def capacity_rps(pipe: Pipeline) -> float:
    """Requests per second a one-stage pipeline sustains at full batches (expected)."""
    (st,) = pipe.stages
    return st.replicas * st.batch * 1e3 / st.expected_ms if st.expected_ms > 0 else math.inf


def e3_problem(chain: ModelChain, cls: DeviceClass, rate: float, slo_ms: float, batch: int,
               transfer: Transfer | None) -> Problem:
    """What the optimizer plans for: one homogeneous class, the SLO, the offered rate."""
    return Problem(chain, (cls,), rate, slo_ms, batch, transfer=transfer)


def e3_pipeline(p: Problem, plan: DeploymentPlan) -> Pipeline:
    """The plan's stages as a pipeline (fusion hold = the problem's hold). An infeasible
    plan has no stages: E3 then serves the vanilla model on every device (the planner's
    own fallback candidate), and the caller reports the plan's reason."""
    classes = {c.name: c for c in p.classes}
    if not plan.feasible:
        c = p.classes[0]
        van = vanilla_pipeline(c.latency, p.chain.ramp_after, c.count, p.batch, c.name,
                               c.cost_per_s)
        return Pipeline("e3", van.stages, van.ramp_after)
    t = p.transfer or Transfer((0.0,) * len(p.chain.ramp_after))
    stages = []
    for i, s in enumerate(plan.stages):
        c = classes[s.device_class]
        cut = plan.cuts[i] if i < len(plan.cuts) else None
        per_row = 0.0 if cut is None else t.bytes_per_sample[cut] * t.ms_per_byte
        stages.append(StageSpec(s.first_block, s.last_block, tuple(s.active_ramps),
                                s.replicas, s.batch, c.latency, s.ms, c.name, c.cost_per_s,
                                0.0 if cut is None else t.fixed_ms, per_row,
                                per_device_links=t.per_device))
    return Pipeline("e3", tuple(stages), p.chain.ramp_after, p.hold_ms)


def fusion_bound(table: LatencyTable, rows_at_blocks: Sequence[float], batch: int) -> float:
    """How much faster than naive early exit E3 could be at most: naive runs block ``k`` on
    batches of ``rows_at_blocks[k]`` (its mean, as simulated); perfect fusion would run the
    same rows in full batches of ``batch``. Block time only (ramp heads and transfers are
    left out): the ratio of naive's block time per batch to that of the same rows fused."""
    rows = np.asarray(rows_at_blocks, dtype=np.float64)
    k = np.flatnonzero(rows > 0)
    naive = float(table.blocks_at(rows[k])[k, np.arange(k.size)].sum())
    fused = float((table.blocks_at(batch)[k] * rows[k] / batch).sum())
    return naive / fused if fused > 0 else 1.0


def useful_sites(thresholds: Sequence[float], exits: np.ndarray) -> tuple[int, ...]:
    """Sites the exit config lets samples out at: a threshold above 0 and at least one
    sample of ``exits`` (computed with every thresholded site active) leaving there."""
    seen = set(np.unique(np.asarray(exits)).tolist())
    return tuple(s for s, t in enumerate(thresholds) if t > 0 and s in seen)
