"""WeightSlice for transformer layers (SuperServe §3.1, transformer case) in torch, and the
importance rewiring that makes a first-k slice worth running (DynaBERT §3.1).

- ``SlicedAttention``: BERT self-attention + output projection + residual LayerNorm, of
  which a call runs the first ``heads`` heads: the matching rows of Q, K and V and the
  matching columns of the output projection, all read from the full weight tensors;
- ``SlicedFeedForward``: BERT's intermediate GELU layer + output projection + residual
  LayerNorm, of which a call runs the first ``neurons`` neurons (rows of the first
  matrix, columns of the second);
- ``ElasticLayer``: one encoder layer of both, ``forward(h, mask, heads, neurons)``.

LayerNorm needs no per-subnet statistics (the paper's SubnetNorm is for batch norm only).
As in :mod:`services.supernet.operators`, the subnet is an argument of every call: no
module state names an active subnet.

Rewiring (DynaBERT): heads and neurons are reordered by importance so that every slice
keeps the most important ones. A head's importance is ``|dL/dm|`` for a mask ``m`` scaling
its context, summed over batches (Michel et al. 2019). That derivative equals
``sum(W_o * dL/dW_o)`` over the head's columns of the output projection (the gradient of
``W_o`` is the sum over tokens of ``delta * context^T``), so it is read off the ordinary
weight gradients; a neuron's is the same over its column of the second FFN matrix.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def additive_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """BERT's additive attention mask, N x 1 x 1 x S: 0 where attended, the dtype's
    minimum at padding (as ``minilm_topics`` builds it)."""
    keep = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - keep) * torch.finfo(dtype).min


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           head_dim: int) -> torch.Tensor:
    """Scaled dot-product attention over however many heads the projections carry:
    N x S x (h * head_dim) in, the context in the same layout out."""
    n, s, width = q.shape
    heads = width // head_dim

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(n, s, heads, head_dim).transpose(1, 2)

    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(head_dim) + mask
    ctx = torch.softmax(scores, dim=-1) @ split(v)
    return ctx.transpose(1, 2).reshape(n, s, width)


class SlicedAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
        self.heads, self.head_dim = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, h: torch.Tensor, mask: torch.Tensor, heads: int) -> torch.Tensor:
        w = heads * self.head_dim
        q, k, v = (F.linear(h, p.weight[:w], p.bias[:w])
                   for p in (self.query, self.key, self.value))
        ctx = attend(q, k, v, mask, self.head_dim)
        return self.norm(F.linear(ctx, self.out.weight[:, :w], self.out.bias) + h)

    def importance(self) -> torch.Tensor:
        """Per head, ``dL/dm`` of the last backward pass (see the module docstring)."""
        g = self.out.weight.grad
        if g is None:
            raise ValueError("no gradient on the attention output: run a backward pass first")
        return (self.out.weight * g).view(-1, self.heads, self.head_dim).sum((0, 2))

    @torch.no_grad()
    def reorder(self, order: torch.Tensor) -> None:
        """Heads permuted to ``order`` (its first entry becomes head 0): the layer's
        function is unchanged, only which heads a slice keeps."""
        rows = (order[:, None] * self.head_dim + torch.arange(self.head_dim)).reshape(-1)
        for p in (self.query, self.key, self.value):
            p.weight.copy_(p.weight[rows])
            p.bias.copy_(p.bias[rows])
        self.out.weight.copy_(self.out.weight[:, rows])


class SlicedFeedForward(nn.Module):
    def __init__(self, hidden: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.inner, self.outer = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, h: torch.Tensor, neurons: int) -> torch.Tensor:
        a = F.gelu(F.linear(h, self.inner.weight[:neurons], self.inner.bias[:neurons]))
        return self.norm(F.linear(a, self.outer.weight[:, :neurons], self.outer.bias) + h)

    def importance(self) -> torch.Tensor:
        g = self.outer.weight.grad
        if g is None:
            raise ValueError("no gradient on the FFN output: run a backward pass first")
        return (self.outer.weight * g).sum(0)

    @torch.no_grad()
    def reorder(self, order: torch.Tensor) -> None:
        self.inner.weight.copy_(self.inner.weight[order])
        self.inner.bias.copy_(self.inner.bias[order])
        self.outer.weight.copy_(self.outer.weight[:, order])


class ElasticLayer(nn.Module):
    """One BERT encoder layer whose heads and FFN neurons are sliced per call."""

    def __init__(self, hidden: int, heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.attention = SlicedAttention(hidden, heads, eps)
        self.ffn = SlicedFeedForward(hidden, ffn, eps)

    def forward(self, h: torch.Tensor, mask: torch.Tensor, heads: int,
                neurons: int) -> torch.Tensor:
        return self.ffn(self.attention(h, mask, heads), neurons)


class StaticLayer(nn.Module):
    """One encoder layer of an extracted subnet: plain layers of the sliced sizes."""

    def __init__(self, layer: ElasticLayer, heads: int, neurons: int) -> None:
        super().__init__()
        a, f = layer.attention, layer.ffn
        w = heads * a.head_dim
        self.head_dim = a.head_dim
        self.query, self.key, self.value = (_linear(p.weight[:w], p.bias[:w])
                                            for p in (a.query, a.key, a.value))
        self.out = _linear(a.out.weight[:, :w], a.out.bias)
        self.norm1 = _layer_norm(a.norm)
        self.inner = _linear(f.inner.weight[:neurons], f.inner.bias[:neurons])
        self.outer = _linear(f.outer.weight[:, :neurons], f.outer.bias)
        self.norm2 = _layer_norm(f.norm)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        ctx = attend(self.query(h), self.key(h), self.value(h), mask, self.head_dim)
        a = self.norm1(self.out(ctx) + h)
        return self.norm2(self.outer(F.gelu(self.inner(a))) + a)


def _linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        lin.weight.copy_(weight)
        lin.bias.copy_(bias)
    return lin


def _layer_norm(norm: nn.LayerNorm) -> nn.LayerNorm:
    out = nn.LayerNorm(norm.normalized_shape, eps=norm.eps)
    out.load_state_dict(norm.state_dict())
    return out
