"""What exit rules could give a generative model's heads (pure): replayed on a recorded
per-token trace (``services.sim.helios_trace``), each rule's mean layers a token needs
before it leaves and its token agreement with the full model.

The bound says how far parallel decoding can go with these heads at best: an exit saves at
most the layers above it, so with free heads and no per-layer overhead decoding speeds up by
at most ``n_layers / mean layers``. Rules:

- ``confidence``: leave at the first head whose top probability reaches ``t`` (what the
  decoder does);
- ``patience``: leave at the first head that agrees with the ``p - 1`` heads before it and
  whose top probability reaches ``t`` (consistency, as PABEE does for classifiers);
- ``oracle``: leave at the first head whose token is the full model's (no rule can know
  this; it is the heads' ceiling).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.sim.helios_trace import CandidateTrace, PromptTrace


@dataclass(frozen=True)
class Rule:
    kind: str  # confidence | patience | oracle
    threshold: float = 0.0
    patience: int = 1
    first_head: int = 1  # heads below this layer are not scored

    def describe(self) -> str:
        heads = f"heads >= {self.first_head}" if self.first_head > 1 else "all heads"
        if self.kind == "oracle":
            return f"oracle, {heads}"
        if self.kind == "patience":
            return f"{self.patience} heads agree, top p >= {self.threshold}, {heads}"
        return f"top p >= {self.threshold}, {heads}"


@dataclass(frozen=True)
class RuleOutcome:
    rule: str
    mean_layers: float
    agreement: float   # tokens whose emitted token is the full model's
    heads_scored: float  # mean heads a token is scored by
    bound: float       # n_layers / mean_layers

    def as_dict(self) -> dict:
        return {"rule": self.rule, "mean_layers": round(self.mean_layers, 3),
                "agreement": round(self.agreement, 4),
                "heads_scored": round(self.heads_scored, 3), "bound": round(self.bound, 3)}


def _leaves(rule: Rule, p: PromptTrace, i: int, layers: Sequence[int]) -> tuple[int, int]:
    """(exit layer or 0 for the last layer, heads scored) of token ``i`` under ``rule``."""
    seen: list[int] = []
    for k in layers:
        head = p.heads[k]
        seen.append(head.token[i])
        if rule.kind == "oracle":
            ok = head.token[i] == p.full_token[i]
        else:
            agree = len(seen) >= rule.patience and len(set(seen[-rule.patience:])) == 1
            ok = agree and head.confidence[i] >= rule.threshold
        if ok:
            return k, len(seen)
    return 0, len(seen)


def replay(trace: CandidateTrace, rule: Rule) -> RuleOutcome:
    """``rule`` over every generated token of ``trace``."""
    if rule.kind not in ("confidence", "patience", "oracle") or rule.patience < 1:
        raise ValueError(f"unknown exit rule {rule}")
    layers = [k for k in trace.head_layers if k >= rule.first_head]
    total = agree = scored = tokens = 0
    for p in trace.prompts:
        for i, full in enumerate(p.full_token):
            k, n = _leaves(rule, p, i, layers)
            total += k or trace.n_layers
            agree += (p.heads[k].token[i] if k else full) == full
            scored += n
            tokens += 1
    mean = total / tokens
    return RuleOutcome(rule.describe(), mean, agree / tokens, scored / tokens,
                       trace.n_layers / mean)


def standard_rules(head_layers: Sequence[int]) -> list[Rule]:
    """The rules ``offramp bench decode --bounds`` prints: the decoder's, consistency, the
    oracle; over all heads and over the upper half of them."""
    upper = head_layers[len(head_layers) // 2] if head_layers else 1
    rules = [Rule("oracle"), Rule("oracle", first_head=upper)]
    for t in (0.5, 0.8, 0.9):
        rules += [Rule("confidence", t), Rule("confidence", t, first_head=upper)]
    for p, t in ((2, 0.3), (2, 0.5), (3, 0.3), (3, 0.5)):
        rules.append(Rule("patience", t, p))
    return rules
