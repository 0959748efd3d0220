"""Exit heads of a generative (Llama-family) model: what an exited token's logits come from.

The model's own final norm and LM head read at a middle layer agree with its last layer on
almost no tokens before the last few layers (SmolLM2-135M: 0-13 % up to layer 22), while
looking confident. An exit head learns the missing step: an RMS norm and a low-rank
residual correction of the layer's hidden state, then the model's own final norm and tied
embedding, so it adds ``2 * hidden * rank`` parameters and no vocabulary-sized matrix.
The correction starts at zero: an untrained head is the final head read early.

Heads sit after layers ``head_layers(n_layers, count)`` (1-based: after layer k means the
hidden state ``k`` transformer layers in); they are trained by distillation
(``services.prepare.llm_heads``) and saved as one state dict.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

RANK = 64  # the correction's rank: 74 K parameters per head on a 576-wide model


def head_layers(n_layers: int, count: int) -> list[int]:
    """``count`` evenly spaced exit layers below the last (1-based depths, ascending)."""
    if not 0 < count < n_layers:
        raise ValueError(f"cannot place {count} exit heads in {n_layers} layers")
    step = n_layers / (count + 1)
    return sorted({max(1, min(n_layers - 1, round(step * (i + 1)))) for i in range(count)})


class ExitHead(nn.Module):
    """Logits for the token after a hidden state read at one middle layer."""

    def __init__(self, hidden: int, rank: int = RANK, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.norm = nn.Parameter(torch.ones(hidden))
        self.down = nn.Linear(hidden, rank, bias=False)
        self.up = nn.Linear(rank, hidden, bias=False)
        nn.init.zeros_(self.up.weight)  # starts as the final head read early

    def corrected(self, h: torch.Tensor) -> torch.Tensor:
        """The hidden state as the final norm should see it."""
        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm
        return h + self.up(self.down(x))

    def forward(self, h: torch.Tensor, final_norm: nn.Module,
                embed: torch.Tensor) -> torch.Tensor:
        """Logits (``... x vocab``) from hidden states ``h`` (``... x hidden``), through the
        model's final norm and its (tied) output embedding ``embed`` (``vocab x hidden``)."""
        return nn.functional.linear(final_norm(self.corrected(h)), embed)


class ExitHeads(nn.Module):
    """The heads of one model, keyed by exit layer."""

    def __init__(self, hidden: int, layers: list[int], rank: int = RANK,
                 eps: float = 1e-5) -> None:
        super().__init__()
        self.layers = sorted(layers)
        self.rank = rank
        self.heads = nn.ModuleDict({str(k): ExitHead(hidden, rank, eps) for k in self.layers})

    def __getitem__(self, layer: int) -> ExitHead:
        return self.heads[str(layer)]

    def __contains__(self, layer: object) -> bool:
        return str(layer) in self.heads

    def save(self, path: Path) -> None:
        torch.save({"layers": self.layers, "rank": self.rank,
                    "hidden": int(next(iter(self.heads.values())).norm.numel()),
                    "state": self.state_dict()}, path)

    @classmethod
    def load(cls, path: Path) -> ExitHeads:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        heads = cls(int(blob["hidden"]), [int(k) for k in blob["layers"]], int(blob["rank"]))
        heads.load_state_dict(blob["state"])
        return heads.eval()
