"""HELIOS's re-assessment schedule (pure): every RI requests an evaluation phase runs the
first prompts on the candidates, whose figures go into the Performance History Table."""

from __future__ import annotations

from dataclasses import dataclass

RI = 150  # re-assessment interval, requests (004 §3.3.4)
EVAL_PROMPTS = 5  # prompts each candidate serves in an evaluation phase (004 §3.3.2)


@dataclass(frozen=True)
class ReassessSchedule:
    """Which requests (0-based arrival numbers) are evaluation requests, on which candidates.

    Every ``ri`` requests an assessment starts with an evaluation phase. By default (004
    §3.3.2: "each candidate ... for five requests", sequentially) the phase gives each
    candidate in turn ``eval_prompts`` requests; with ``shared`` each of the first
    ``eval_prompts`` requests runs on every candidate (same text, so perplexities compare)
    and the first candidate's answer is returned. Either way evaluation answers are returned
    to the user (App. E), so the phase counts toward the ``ri`` requests (Choice).
    """

    candidates: tuple[str, ...]
    ri: int = RI
    eval_prompts: int = EVAL_PROMPTS
    shared: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", tuple(self.candidates))
        if self.ri < 1 or self.eval_prompts < 0 or self.phase_length > self.ri:
            raise ValueError(f"evaluation phase of {self.phase_length} does not fit RI {self.ri}")

    @property
    def phase_length(self) -> int:
        return self.eval_prompts * (1 if self.shared else len(self.candidates))

    def assessment(self, n: int) -> int:
        """Number of the assessment interval request ``n`` falls in (0, 1, ...)."""
        return n // self.ri

    def is_evaluation(self, n: int) -> bool:
        return n % self.ri < self.phase_length

    def eval_candidates(self, n: int) -> tuple[str, ...]:
        """Candidates request ``n`` runs on as an evaluation request; () when it is served
        by the chosen candidate. The first one's answer is returned."""
        i = n % self.ri
        if i >= self.phase_length:
            return ()
        return self.candidates if self.shared else (self.candidates[i // self.eval_prompts],)

    def phase_end(self, n: int) -> int:
        """First request after the evaluation phase of ``n``'s interval: the one the
        assessment's chosen candidate serves first."""
        return self.assessment(n) * self.ri + self.phase_length

    def next_assessment(self, n: int) -> int:
        """First request of the next interval (its evaluation phase, if any)."""
        return (self.assessment(n) + 1) * self.ri
