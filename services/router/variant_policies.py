"""Policies that choose a variant and a batch size per batch (SuperServe §4.2, App. A.5),
behind the router's ``Policy`` interface: the choice travels in ``BatchDecision.variant``.

All of them are greedy in time and work-conserving, as SuperServe's are: whenever a worker
is free and requests wait, they decide from the slack ``theta`` of the most urgent request
(the time left before its deadline, less the hop overhead, divided by the live slowdown
the router measured: profiles are taken on an idle machine) and dispatch at once; the
router packs the chosen number of requests in EDF order.

- **SlackFit**: latency buckets evenly spaced between the fastest variant at batch 1 and
  the slowest at the largest batch; in each bucket, the (variant, batch) with the largest
  batch (then the most accurate); online, the bucket whose pick is closest below theta.
  Below the lowest bucket's pick, the fastest variant's largest batch that fits theta.
  Where the queue outlasts one batch round over the workers (the paper is silent; its
  queues sit in front of many workers), the pick whose rounds drain the whole queue
  closest below theta; if none does, the choice saving the most requests per ms.
  Where the queue holds fewer requests than the pick's batch (the paper is silent; its
  queues are long), the batch the queue holds on the most accurate variant that fits
  theta, if that is more accurate than the pick: a batch that cannot be filled buys no
  throughput, so its accuracy would be given up for nothing.
- **MaxBatch**: the largest batch the least accurate variant fits in theta, then the most
  accurate variant that fits that batch.
- **MaxAcc**: the most accurate variant that fits batch 1 in theta, then its largest
  batch that fits.
- **Clipper+** (``fixed``): one variant for the whole run; its largest batch that fits.
- **INFaaS-like**: the cheapest variant whose accuracy meets a floor (without a floor, the
  cheapest of all), its largest batch that fits.

When nothing fits theta (the head request is already late for every choice) each policy
dispatches the fastest choice it has: the router refuses what is past its deadline, and
what is still alive is best served as fast as possible.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from services.router.policy import BatchDecision, QueueView
from services.router.variant_table import Choice, VariantProfile, choices, pareto

DEFAULT_BUCKETS = 16   # latency levels SlackFit tells apart between its fastest and slowest


def _check(variants: Sequence[VariantProfile], max_batch: int) -> list[VariantProfile]:
    if not variants:
        raise ValueError("a variant policy needs at least one profiled variant")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    return list(variants)


def _largest_fit(v: VariantProfile, max_batch: int, theta: float) -> int:
    """Largest batch of ``v`` whose time is within ``theta`` (0 when not even batch 1)."""
    return bisect.bisect_right(v.latencies(max_batch), theta)  # curves rise with the batch


def theta_ms(view: QueueView, overhead_ms: float, left_ms: float | None = None) -> float:
    """The slack a batch's profiled time must fit: the time to the earliest deadline (or
    ``left_ms``), less the hops, in profile time (divided by how much slower batches run
    live than profiled)."""
    left = view.deadline_ms if left_ms is None else left_ms
    return (left - overhead_ms) / max(view.slowdown, 1e-6)


def _decide(choice: Choice, view: QueueView) -> BatchDecision:
    if view.size <= 0:
        return BatchDecision(0)
    return BatchDecision(min(choice.batch, view.size), variant=choice.variant)


class SlackDriven:
    """What every policy here does with a queue view: choose on its slack, pack EDF."""

    overhead_ms: float

    def choose(self, theta_ms: float) -> Choice:
        raise NotImplementedError

    def decide(self, view: QueueView) -> BatchDecision:
        return _decide(self.choose(theta_ms(view, self.overhead_ms)), view)


def by_accuracy(variants: Sequence[VariantProfile], max_batch: int) -> list[VariantProfile]:
    """The frontier, least accurate first."""
    return sorted(pareto(_check(variants, max_batch), max_batch), key=lambda v: v.accuracy)


@dataclass(frozen=True)
class SlackFitTable:
    """SlackFit's offline phase: bucket edges and each bucket's pick, by ascending
    latency (empty buckets dropped)."""

    edges: tuple[float, ...]
    picks: tuple[Choice, ...]


def slackfit_table(variants: Sequence[VariantProfile], max_batch: int,
                   buckets: int = DEFAULT_BUCKETS) -> SlackFitTable:
    variants = pareto(_check(variants, max_batch), max_batch)
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    lo = min(v.latency(1) for v in variants)
    hi = max(v.latency(max_batch) for v in variants)
    edges = np.linspace(lo, hi, buckets + 1)
    best: dict[int, Choice] = {}
    for c in choices(variants, max_batch):
        i = min(buckets - 1, max(0, int(np.searchsorted(edges, c.latency_ms, side="left")) - 1))
        held = best.get(i)
        if held is None or (c.batch, c.accuracy, -c.latency_ms) > (
                held.batch, held.accuracy, -held.latency_ms):
            best[i] = c
    picks = sorted(best.values(), key=lambda c: c.latency_ms)
    return SlackFitTable(tuple(float(e) for e in edges), tuple(picks))


@dataclass
class SlackFit(SlackDriven):
    variants: Sequence[VariantProfile]
    max_batch: int = 16
    buckets: int = DEFAULT_BUCKETS
    overhead_ms: float = 0.0   # taken off theta: the hops a batch makes besides running
    name: str = "slackfit"
    table: SlackFitTable = field(init=False)
    _latencies: list[float] = field(init=False)
    _fastest: VariantProfile = field(init=False)
    _frontier: list[VariantProfile] = field(init=False)

    def __post_init__(self) -> None:
        self.table = slackfit_table(self.variants, self.max_batch, self.buckets)
        self._latencies = [c.latency_ms for c in self.table.picks]
        self._fastest = min(self.variants, key=lambda v: (v.latency(1), -v.accuracy))
        self._frontier = by_accuracy(self.variants, self.max_batch)

    def decide(self, view: QueueView) -> BatchDecision:
        """SlackFit's pick; but when the queue cannot fill the pick's batch, the batch the
        queue holds on the most accurate variant that fits the slack: the pick traded
        accuracy for a batch size that is not there to serve."""
        theta = theta_ms(view, self.overhead_ms)
        choice = self.drain_choice(view, theta)
        if 0 < view.size < choice.batch:
            fits = [v for v in self._frontier if v.latency(view.size) <= theta]
            if fits and fits[-1].accuracy > choice.accuracy:
                return BatchDecision(view.size, variant=fits[-1].key)
        return _decide(choice, view)

    def drain_choice(self, view: QueueView, theta: float) -> Choice:
        """The pick whose time to drain the queue (its rounds over the workers, each the
        pick's batch time) is closest below ``theta``. When no pick drains it in time, the
        choice that saves the most requests per ms of worker time: a burst lost to a run
        of small batches, each just in time for its head, is lost whole."""
        size, workers = view.size, max(1, view.workers)
        if size <= 0:
            return self.choose(theta)
        def drain(c: Choice) -> float:
            return -(-size // (c.batch * workers)) * c.latency_ms
        fits = [c for c in self.table.picks if drain(c) <= theta]
        if fits:
            return max(fits, key=lambda c: (drain(c), c.accuracy))
        # earliest first, as the view holds them
        slack = [theta_ms(view, self.overhead_ms, d) for d in view.deadlines_ms] or [theta]
        def saved_per_ms(c: Choice) -> float:
            # requests that miss are a prefix of the EDF order; unseen ones (beyond the
            # view) are due no earlier than the last one seen
            late = bisect.bisect_left(slack, c.latency_ms)
            return 0.0 if late >= len(slack) else max(0, min(c.batch, size) - late) / c.latency_ms
        head = self.choose(theta)
        return max([head, *self.table.picks],
                   key=lambda c: (saved_per_ms(c), c is head, c.accuracy))

    def choose(self, theta_ms: float) -> Choice:
        i = bisect.bisect_right(self._latencies, theta_ms) - 1
        if i >= 0:
            return self.table.picks[i]
        # below the lowest bucket's pick: the fastest variant's largest batch that fits
        fastest = self._fastest
        b = max(1, _largest_fit(fastest, self.max_batch, theta_ms))
        return Choice(fastest.key, b, fastest.latency(b), fastest.accuracy)


@dataclass
class MaxBatch(SlackDriven):
    variants: Sequence[VariantProfile]
    max_batch: int = 16
    overhead_ms: float = 0.0
    name: str = "maxbatch"

    def __post_init__(self) -> None:
        self.variants = by_accuracy(self.variants, self.max_batch)

    def choose(self, theta_ms: float) -> Choice:
        least = self.variants[0]
        b = _largest_fit(least, self.max_batch, theta_ms)
        if b == 0:
            return Choice(least.key, 1, least.latency(1), least.accuracy)
        best = max((v for v in self.variants if v.latency(b) <= theta_ms),
                   key=lambda v: v.accuracy)
        return Choice(best.key, b, best.latency(b), best.accuracy)


@dataclass
class MaxAcc(SlackDriven):
    variants: Sequence[VariantProfile]
    max_batch: int = 16
    overhead_ms: float = 0.0
    name: str = "maxacc"

    def __post_init__(self) -> None:
        self.variants = by_accuracy(self.variants, self.max_batch)

    def choose(self, theta_ms: float) -> Choice:
        fits = [v for v in self.variants if v.latency(1) <= theta_ms]
        best = fits[-1] if fits else min(self.variants, key=lambda v: v.latency(1))
        b = max(1, _largest_fit(best, self.max_batch, theta_ms))
        return Choice(best.key, b, best.latency(b), best.accuracy)


@dataclass
class FixedVariant(SlackDriven):
    """Clipper+: one variant, chosen by the operator, served at its largest batch that
    fits theta."""

    variants: Sequence[VariantProfile]
    variant: str
    max_batch: int = 16
    overhead_ms: float = 0.0
    name: str = "fixed-variant"
    _profile: VariantProfile = field(init=False)

    def __post_init__(self) -> None:
        found = [v for v in _check(self.variants, self.max_batch) if v.key == self.variant]
        if not found:
            raise ValueError(f"unknown variant {self.variant!r}; known: "
                             f"{', '.join(v.key for v in self.variants)}")
        self._profile = found[0]

    def choose(self, theta_ms: float) -> Choice:
        v = self._profile
        b = max(1, _largest_fit(v, self.max_batch, theta_ms))
        return Choice(v.key, b, v.latency(b), v.accuracy)


def infaas_variant(variants: Sequence[VariantProfile], floor: float | None = None,
                   batch: int = 1) -> str:
    """INFaaS's pick: the cheapest variant (fastest at ``batch``) whose accuracy meets
    ``floor``; without a floor, the cheapest of all (SuperServe §6.1)."""
    ok = [v for v in variants if floor is None or v.accuracy >= floor]
    if not ok:
        raise ValueError(f"no variant reaches accuracy {floor}; the best has "
                         f"{max(v.accuracy for v in variants):.4f}")
    return min(ok, key=lambda v: (v.latency(batch), -v.accuracy)).key


def infaas_like(variants: Sequence[VariantProfile], floor: float | None = None,
                max_batch: int = 16, overhead_ms: float = 0.0) -> FixedVariant:
    return FixedVariant(variants, infaas_variant(variants, floor), max_batch, overhead_ms,
                        name="infaas")


def make_variant_policy(name: str, variants: Sequence[VariantProfile], max_batch: int = 16,
                        overhead_ms: float = 0.0):
    """The policy ``OFFRAMP_ROUTER_POLICY`` names (``slackfit``, ``maxacc``, ``maxbatch``,
    ``infaas``, ``variant=KEY``) over a model's variants."""
    if name == "slackfit":
        return SlackFit(variants, max_batch, overhead_ms=overhead_ms)
    if name == "maxacc":
        return MaxAcc(variants, max_batch, overhead_ms)
    if name == "maxbatch":
        return MaxBatch(variants, max_batch, overhead_ms)
    if name == "infaas":
        return infaas_like(variants, None, max_batch, overhead_ms)
    if name.startswith("variant="):
        return FixedVariant(variants, name.removeprefix("variant="), max_batch, overhead_ms,
                            name="clipper+")
    raise ValueError(f"unknown variant policy {name!r}")
