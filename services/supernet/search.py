"""Pareto profiling of a supernet (SuperServe §4.2 offline phase, §5 "SuperNet profiler"):
which subnets are worth serving, with their accuracy and their latency per batch size.

1. Candidates: the largest and smallest subnets and ``random`` subnets drawn from the
   space, then ``mutations`` children of the frontier found so far (one stage's depth or
   width changed): random search plus one evolutionary round, as NAS's search stage.
2. Each candidate is calibrated (its own normalization statistics, on training crops),
   then scored on held-out inputs: agreement with the largest subnet (the "full model"),
   and labelled accuracy when labels are given; and timed at ``SEARCH_BATCH``.
3. The frontier on (latency, agreement) is timed at every batch size of ``BATCHES``: those
   rows are what the router's variant table and the store's ``subnet_profiles`` hold.

Latencies are medians of repeated runs on this process's threads: a profile of this
machine, not a model of it.

Any supernet with ``space`` and ``forward(inputs, subnet)`` is searched the same way:
inputs are a tensor or a mapping of named tensors (a text model's ids and mask). A
supernet without ``SubnetNorm`` (a transformer: LayerNorm only) needs no calibration; one
with its own ``predict(inputs, subnet)`` scores with it (a transformer batches by length),
and a space with its own ``mutate`` mutates with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from services.supernet.operators import calibrate, norms
from services.supernet.subnet import Subnet, SubnetSpace

BATCHES = (1, 2, 4, 8, 16)   # batch sizes of a frontier subnet's latency profile
SEARCH_BATCH = 8             # batch size candidates are compared at
REPEATS = 7                  # timed runs per (subnet, batch); the median is kept


@dataclass
class SubnetScore:
    subnet: Subnet
    agreement: float                 # with the largest subnet, on the held-out inputs
    accuracy: float | None           # against labels, when there are labels
    search_ms: float                 # latency at SEARCH_BATCH
    latency_ms: dict[int, float] = field(default_factory=dict)   # frontier only: per batch
    pareto: bool = False

    def to_dict(self) -> dict:
        return {"subnet": self.subnet.key, "agreement": self.agreement,
                "accuracy": self.accuracy, "search_ms": self.search_ms,
                "latency_ms": {str(b): ms for b, ms in sorted(self.latency_ms.items())},
                "pareto": self.pareto}


def rows(x, n: int):
    """The first ``n`` rows of a tensor or of every tensor of a mapping."""
    return {k: v[:n] for k, v in x.items()} if isinstance(x, Mapping) else x[:n]


@torch.no_grad()
def latency_ms(net: nn.Module, subnet: Subnet, x: torch.Tensor,
               repeats: int = REPEATS) -> float:
    """Median wall time of one forward of ``x`` through ``subnet`` (after a warm-up)."""
    net(x, subnet)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        net(x, subnet)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


@torch.no_grad()
def predict(net: nn.Module, subnet: Subnet, x: torch.Tensor, chunk: int = 256) -> np.ndarray:
    if hasattr(net, "predict"):
        return net.predict(x, subnet)
    return torch.cat([net(x[i:i + chunk], subnet).argmax(1)
                      for i in range(0, len(x), chunk)]).numpy()


def frontier(scores: Sequence[SubnetScore]) -> list[SubnetScore]:
    """Scores no other beats on both search latency and agreement, fastest first."""
    best: list[SubnetScore] = []
    for s in sorted(scores, key=lambda s: (s.search_ms, -s.agreement)):
        if not best or s.agreement > best[-1].agreement:
            best.append(s)
    return best


def mutate(subnet: Subnet, space: SubnetSpace, rng: np.random.Generator) -> Subnet:
    """``subnet`` with one stage's depth or width moved to another allowed value."""
    depths, widths = list(subnet.depths), list(subnet.widths)
    m = int(rng.integers(space.stages))
    if rng.random() < 0.5 and space.max_depths[m] > 1:
        depths[m] = int(rng.choice([d for d in range(1, space.max_depths[m] + 1)
                                    if d != depths[m]]))
    else:
        widths[m] = float(rng.choice([w for w in space.width_choices if w != widths[m]]))
    return Subnet(tuple(depths), tuple(widths))


@dataclass
class Search:
    """One search: the supernet, its calibration batches and held-out inputs."""

    net: nn.Module
    calib: Sequence[torch.Tensor]
    inputs: torch.Tensor
    labels: np.ndarray | None = None
    log: Callable[[str], None] | None = None
    timing: object = None   # inputs latencies are measured on (default: ``inputs``)
    scores: dict[str, SubnetScore] = field(default_factory=dict)
    reference: np.ndarray | None = None

    def score(self, subnet: Subnet) -> SubnetScore:
        if subnet.key in self.scores:
            return self.scores[subnet.key]
        if norms(self.net):
            calibrate(self.net, subnet.key, lambda x: self.net(x, subnet), self.calib)
        pred = predict(self.net, subnet, self.inputs)
        if self.reference is None:
            self.reference = pred   # the largest subnet is scored first
        acc = None if self.labels is None else float((pred == self.labels).mean())
        s = SubnetScore(subnet, float((pred == self.reference).mean()), acc,
                        latency_ms(self.net, subnet, rows(self._timing, SEARCH_BATCH)))
        self.scores[subnet.key] = s
        return s

    def run(self, random: int = 64, mutations: int = 24, seed: int = 0) -> list[SubnetScore]:
        """Every candidate scored; the frontier's members carry ``pareto`` and their
        latency per batch size (see the module docstring)."""
        space, rng = self.net.space, np.random.default_rng(seed)
        started = time.monotonic()
        for subnet in [space.largest, space.smallest,
                       *(space.sample(rng) for _ in range(random))]:
            self.score(subnet)
        self._say(f"{len(self.scores)} random candidates scored", started)
        for _ in range(mutations):
            parents = frontier(list(self.scores.values()))
            parent = parents[int(rng.integers(len(parents)))].subnet
            self.score(space.mutate(parent, rng) if hasattr(space, "mutate")
                       else mutate(parent, space, rng))
        best = frontier(list(self.scores.values()))
        self._say(f"{len(self.scores)} candidates, {len(best)} on the frontier", started)
        for s in best:
            s.pareto = True
            s.latency_ms = {b: latency_ms(self.net, s.subnet, rows(self._timing, b))
                            for b in BATCHES}
        # the largest stays servable even off the frontier: it is the model as trained,
        # what a batch without a variant runs
        self._drop_stats(keep={s.subnet.key for s in best} | {space.largest.key})
        return sorted(self.scores.values(), key=lambda s: s.search_ms)

    @property
    def _timing(self):
        return self.inputs if self.timing is None else self.timing

    def _drop_stats(self, keep: set[str]) -> None:
        """Keep normalization statistics of ``keep`` only: what is served."""
        for norm in norms(self.net):
            norm.stats = {k: v for k, v in norm.stats.items() if k in keep}

    def _say(self, what: str, started: float) -> None:
        if self.log:
            self.log(f"subnet search: {what} ({time.monotonic() - started:.0f} s)")
