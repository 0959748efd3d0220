"""HELIOS's Confidence Breach Counter (pure): a token whose exit lies deeper than the loaded
depth still leaves there, but counts as a breach; too many breaches in a window of tokens
ask ``optimizer.helios.load_or_switch`` to load more layers or switch model."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

CBC_MAX = 50  # breaches tolerated ... (004 §3.3.3)
CBC_WINDOW = 100  # ... per this many consecutive tokens


@dataclass
class BreachCounter:
    """Confidence Breach Counter over the last ``window`` tokens: ``breached`` once more than
    ``cbc_max`` of them failed their threshold at the loaded depth (would have needed deeper
    layers). Choice: a sliding window (the papers: "within a window of consecutive tokens";
    Algorithm 1 counts since the last reset). It can breach before ``window`` tokens are seen;
    call :meth:`reset` after a decision and when an assessment starts (Algorithm 1)."""

    cbc_max: int = CBC_MAX
    window: int = CBC_WINDOW
    count: int = field(default=0, init=False)
    recent: deque[bool] = field(default_factory=deque, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.cbc_max < self.window:
            raise ValueError(f"need 0 <= cbc_max < window, got {self.cbc_max}, {self.window}")

    @property
    def breached(self) -> bool:
        return self.count > self.cbc_max

    def observe(self, breach: bool) -> bool:
        """One token's outcome; returns whether the counter is breached now."""
        self.recent.append(bool(breach))
        self.count += bool(breach)
        if len(self.recent) > self.window:
            self.count -= self.recent.popleft()
        return self.breached

    def first_breach(self, breaches: Iterable[bool]) -> int | None:
        """Feed outcomes until the counter breaches: the index of that token, or None when
        all were fed without a breach (tokens after a breach are not consumed)."""
        for i, b in enumerate(breaches):
            if self.observe(b):
                return i
        return None

    def reset(self) -> None:
        self.count = 0
        self.recent.clear()


def breaches(exits: Iterable[int], depth: int) -> list[bool]:
    """Per token: did it need layers deeper than ``depth`` (exit layer > depth)?"""
    return [int(e) > depth for e in exits]


