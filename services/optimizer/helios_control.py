"""HELIOS's live control loop (pure): from the decision in force, what the current
assessment has served so far and the Performance History Table, the next decision for one
served generative model -- Algorithm 1 of 004 driven by served requests instead of a loop.

- No decision yet: assessment 1 starts with an evaluation.
- Evaluation (``evaluate``): each top-k candidate in turn serves ``eval_prompts`` requests
  fully loaded, with the heads its workers score (the exit distribution is over them);
  their answers are returned to clients (App. E). When the last one has served its share
  and the profiler's PHT rows cover every evaluated request, ``choose_after_assessment``
  picks the candidate and greedy depth that serve the rest of the assessment.
- Serving: after ``ri`` requests of the assessment (evaluation included, as
  ``helios_schedule.ReassessSchedule`` counts them) the next assessment starts.
- A confidence breach (the tuner's counter) of the decision in force asks
  ``load_or_switch``.

Choice: requests are counted when they end (a stream is tagged with the assessment in force
when it started), so a decision can lag the count by the streams in flight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.optimizer.helios import (
    GREEDY_Q,
    Candidate,
    PhtRow,
    Slo,
    SwitchCosts,
    choose_after_assessment,
    load_or_switch,
    max_batch,
)
from services.optimizer.helios_schedule import EVAL_PROMPTS, RI


@dataclass(frozen=True)
class Settings:
    """The loop's parameters: re-assessment interval and evaluation share (requests), the
    SLO, memory budget (bytes) and tokens a request holds, the greedy quantile."""

    ri: int = RI
    eval_prompts: int = EVAL_PROMPTS
    slo: Slo = field(default_factory=Slo)
    memory_budget: int = 2**30
    tokens_per_request: int = 1024
    q: float = GREEDY_Q

    def __post_init__(self) -> None:
        if self.ri < 1 or self.eval_prompts < 1:
            raise ValueError(f"need ri >= 1 and eval_prompts >= 1, got {self.ri}, "
                             f"{self.eval_prompts}")


@dataclass(frozen=True)
class Step:
    """A decision to store and broadcast (``helios_decisions`` columns)."""

    kind: str
    candidate: str
    depth: int
    assessment: int
    reason: str
    batch: int | None = None
    load_bytes: int | None = None
    load_ms: float | None = None
    cost_ms: float | None = None


@dataclass(frozen=True)
class Served:
    """What an assessment served on one candidate at one depth: requests and tokens in the
    generation history, and the tokens its PHT row covers so far (0: no row yet)."""

    candidate: str
    depth: int
    requests: int
    tokens: int
    pht_tokens: int = 0


def _evaluate(c: Candidate, assessment: int, s: Settings, why: str) -> Step:
    return Step("evaluate", c.name, c.n_layers, assessment,
                f"{why}: {c.name} serves {s.eval_prompts} requests fully loaded",
                max_batch(c, c.n_layers, s.memory_budget, s.tokens_per_request))


def next_step(current: Mapping[str, Any] | None, pool: Sequence[Candidate],
              served: Sequence[Served], pht: Sequence[PhtRow], s: Settings) -> Step | None:
    """The next decision, or None while the one in force holds. ``current``: the newest
    stored decision (``kind``, ``candidate``, ``depth``, ``assessment``); ``pool``: the top-k
    candidates, best first; ``served``: the current assessment's history."""
    if not pool:
        return None
    if current is None or current.get("assessment") is None:
        return _evaluate(pool[0], 1, s, "assessment 1 starts")
    a = int(current["assessment"])
    if sum(x.requests for x in served) >= s.ri:
        return _evaluate(pool[0], a + 1, s, f"{s.ri} requests served: assessment {a + 1} "
                                            "starts")
    if current["kind"] != "evaluate":
        return None
    names = [c.name for c in pool]
    by_name = {c.name: c for c in pool}
    at = names.index(current["candidate"]) if current["candidate"] in by_name else len(pool)
    if at < len(pool):
        c = by_name[current["candidate"]]
        done = sum(x.requests for x in served if x.candidate == c.name and x.depth == c.n_layers)
        if done < s.eval_prompts:
            return None
        if at + 1 < len(pool):
            return _evaluate(pool[at + 1], a, s, f"assessment {a}: next candidate")
    evaluated = [x for x in served if x.candidate in by_name
                 and x.depth == by_name[x.candidate].n_layers]
    if not evaluated or any(x.pht_tokens < x.tokens for x in evaluated):
        return None  # the profiler has not recorded every evaluated request yet
    resident = (current["candidate"], int(current["depth"]))
    d = choose_after_assessment(pool, pht, s.slo, resident, s.memory_budget,
                                s.tokens_per_request, s.q)
    c = by_name[d.candidate]
    return Step(d.kind, d.candidate, d.depth, a, d.reason,
                max_batch(c, d.depth, s.memory_budget, s.tokens_per_request), d.load_bytes)


def on_breach(current: Mapping[str, Any] | None, decision: int, pool: Sequence[Candidate],
              pht: Sequence[PhtRow], costs: SwitchCosts, s: Settings) -> Step | None:
    """A breach of decision ``decision``: load or switch, if it is still the one in force
    (``current['id']``) and serves a pool candidate below full depth."""
    if current is None or int(current.get("id", -1)) != decision \
            or current["kind"] == "evaluate":
        return None
    by_name = {c.name: c for c in pool}
    c = by_name.get(current["candidate"])
    if c is None or int(current["depth"]) >= c.n_layers:
        return None
    d = load_or_switch(c, int(current["depth"]), pool, pht, costs, s.memory_budget,
                       s.tokens_per_request)
    target = by_name[d.candidate]
    return Step(d.kind, d.candidate, d.depth, int(current["assessment"]), d.reason,
                max_batch(target, d.depth, s.memory_budget, s.tokens_per_request),
                d.load_bytes, d.load_ms, d.cost_ms)
