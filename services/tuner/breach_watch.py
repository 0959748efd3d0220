"""HELIOS's breach watch for one served generative model (pure): follows the optimizer's
decisions and feeds the Confidence Breach Counter (``breach_counter``) the tokens served
under the decision in force; when it trips, one ``BreachAlert`` asks the optimizer to load
more layers or switch candidate (004 §3.3.3, Algorithm 1).

Choice: tokens of concurrent streams reach the counter stream by stream, in the order the
streams end (a worker reports a stream when it ends, not token by token), each stream's in
token order. The window is thus "the last ``window`` tokens reported", not wall-clock order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.helios import BreachAlert, GenerationRecord, HeliosChoice
from services.tuner.breach_counter import CBC_MAX, CBC_WINDOW, BreachCounter


@dataclass
class BreachWatch:
    """The counter of ``model`` under its current decision. Nothing counts before a
    decision is known; after an alert the watch is disarmed until the next decision, so
    the optimizer gets one alert per decision, not one per breaching stream while it
    decides."""

    model: str
    cbc_max: int = CBC_MAX
    window: int = CBC_WINDOW
    choice: HeliosChoice | None = field(default=None, init=False)
    armed: bool = field(default=False, init=False)
    counter: BreachCounter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.counter = BreachCounter(self.cbc_max, self.window)

    def follow(self, choice: HeliosChoice) -> None:
        """Adopt ``choice`` if it is newer than the decision in force (decisions are
        re-broadcast: an old or repeated one changes nothing, the count goes on)."""
        if self.choice is not None and choice.decision <= self.choice.decision:
            return
        self.choice = choice
        # Algorithm 1 resets the CBC after a decision and when an assessment starts; an
        # assessment starts with a decision of its own, so one reset covers both
        self.counter.reset()
        # evaluation serves at full depth: no token can breach there (armed anyway would
        # be harmless, but a stray record must not turn an assessment into an alert)
        self.armed = choice.kind != "evaluate"

    def counts(self, record: GenerationRecord) -> bool:
        """Does ``record`` speak for the decision in force? Only streams served by its
        candidate at its depth: one that started before a load ran at the old depth."""
        c = self.choice
        return c is not None and record.candidate == c.candidate and record.depth == c.depth

    def observe(self, record: GenerationRecord) -> BreachAlert | None:
        """Feed one ended stream's tokens; the alert when the counter trips (then disarmed:
        the stream's remaining tokens and later streams are not counted)."""
        if not self.armed or not self.counts(record):
            return None
        at = set(record.breach_at)
        if self.counter.first_breach(i in at for i in range(record.tokens)) is None:
            return None
        self.armed = False
        c = self.choice
        return BreachAlert(self.model, c.decision, c.candidate, c.depth,
                           breaches=self.counter.count, window=self.counter.window)
