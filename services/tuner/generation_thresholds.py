"""Per-head confidence thresholds of a generative model, tuned on token-level feedback (pure).

Parallel decoding checks every early token for free: when its position reaches the last
layer, the full model's token for it falls out (``runtime.llm_decoder``). LLM workers
report, per checked token, the head it left at, its confidence and whether the full model
agreed (``schemas.helios.GenerationRecord.feedback``). This controller keeps a window of
those per head and moves each head's threshold so that the tokens it lets out agree with
the full model at least ``target`` of the time (the token-agreement constraint, 1 - the
accuracy loss allowed):

- **raise** when the window's agreement is below target: to the smallest threshold at which
  the window's tokens would have met it (their confidences are known), else above every
  confidence seen (the head then answers nothing until probed down again);
- **probe down** by ``step`` when the agreement clears the target by ``margin``: tokens
  below the threshold never exit, so their agreement is unknown until they are let out.

Choice: the constraint holds per head (sufficient for the stream's agreement, which mixes
heads and the last layer). A head's window restarts after its threshold moves: the tokens
it lets out are no longer the same population. Thresholds stay in ``[floor, 1]``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

WINDOW = 400   # checked tokens per head a decision looks at
MIN_TOKENS = 100  # ... at least this many
STEP = 0.02
FLOOR = 0.5
NEVER = 1.0  # a top probability reaches 1.0 only when the head is certain


@dataclass(frozen=True)
class Move:
    layer: int
    before: float
    after: float
    agreement: float
    tokens: int

    def text(self) -> str:
        return (f"head {self.layer}: {self.before:.3f} -> {self.after:.3f} "
                f"(agreement {self.agreement:.4f} over {self.tokens} checked tokens)")


@dataclass
class GenerationThresholds:
    target: float
    window: int = WINDOW
    min_tokens: int = MIN_TOKENS
    step: float = STEP
    margin: float = 0.0  # default: half the loss allowed (set in __post_init__)
    floor: float = FLOOR
    seen: dict[int, deque[tuple[float, int]]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1 or self.min_tokens < 1 or self.window < self.min_tokens:
            raise ValueError("need 0 < target <= 1 and 1 <= min_tokens <= window")
        if self.margin <= 0:
            self.margin = (1 - self.target) / 2

    def observe(self, feedback: Iterable[tuple[int, float, int]]) -> None:
        """Checked tokens: (head layer, confidence, agreed 0/1)."""
        for layer, confidence, agreed in feedback:
            q = self.seen.setdefault(int(layer), deque(maxlen=self.window))
            q.append((float(confidence), int(agreed)))

    def decide(self, current: Mapping[int, float], default: float) -> list[Move]:
        """The heads whose threshold should move (``current``, else ``default``), with the
        window figures behind each; their windows restart."""
        moves = []
        for layer, q in sorted(self.seen.items()):
            if len(q) < self.min_tokens:
                continue
            before = float(current.get(layer, default))
            agreement = sum(a for _, a in q) / len(q)
            after = before
            if agreement < self.target:
                after = max(before, raise_to(q, self.target))
            elif agreement >= self.target + self.margin and before > self.floor:
                after = max(self.floor, before - self.step)
            if after != before:
                moves.append(Move(layer, before, round(after, 6), agreement, len(q)))
                q.clear()
        return moves


def raise_to(tokens: Iterable[tuple[float, int]], target: float) -> float:
    """The smallest threshold at which the tokens at or above it agree at least ``target``
    of the time; ``NEVER`` when no threshold does."""
    ranked = sorted(tokens, reverse=True)  # most confident first
    best, agreed = NEVER, 0
    for n, (confidence, ok) in enumerate(ranked, start=1):
        agreed += ok
        if agreed / n >= target and (n == len(ranked) or ranked[n][0] < confidence):
            best = confidence  # every token at this confidence or above is in
    return best
