"""A transformer supernet built from SubNetAct's operators over a pretrained BERT encoder
(``minilm-topics``' MiniLM-L6), with elastic depth and width (SuperServe §3.1, DynaBERT).

Layout, as ``minilm_topics.MiniLMTopics`` computes it: BERT embeddings (word + position +
token type 0, LayerNorm), the encoder layers, masked mean pooling over real tokens, L2
normalisation, a linear head. The subnet decides:

- depth: which layers run (LayerSelect with the every-other rule, ``kept_layers``);
- widths: how many attention heads and FFN neurons of every layer run (WeightSlice).

One head per depth: a depth-2 subnet's pooled features are not the full model's, so each
depth gets its own linear head (6 x 3.9 k parameters for MiniLM, next to 22.7 M shared),
as each subnet of the conv supernet gets its own normalization statistics. Embeddings
and every layer are shared by all subnets.

Plain torch (no ``transformers``): a worker loads it from a state dict alone.
``forward(inputs, subnet)`` serves any subnet from one copy of the weights;
``extract(subnet)`` copies one out as a standalone module (what serving it as a separate
model would load), against which the operators are tested.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from services.supernet.bert_ops import ElasticLayer, StaticLayer, additive_mask
from services.supernet.bert_subnet import (
    BertSubnet,
    BertSubnetSpace,
    kept_layers,
    width_count,
)
from services.supernet.operators import LayerSelect

Inputs = Mapping[str, torch.Tensor]   # {"input_ids", "attention_mask"}: N x S int64


@dataclass(frozen=True)
class BertArch:
    """The encoder's shape (MiniLM-L6's by default), classes, and the subnet space."""

    vocab: int = 30522
    max_positions: int = 512
    type_vocab: int = 2
    hidden: int = 384
    layers: int = 6
    heads: int = 12
    ffn: int = 1536
    eps: float = 1e-12
    classes: int = 10
    head_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    ffn_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    min_depth: int = 1

    @property
    def space(self) -> BertSubnetSpace:
        return BertSubnetSpace(self.layers, self.head_choices, self.ffn_choices,
                               self.min_depth)


class Embeddings(nn.Module):
    def __init__(self, arch: BertArch) -> None:
        super().__init__()
        self.word = nn.Embedding(arch.vocab, arch.hidden)
        self.position = nn.Embedding(arch.max_positions, arch.hidden)
        self.token_type = nn.Embedding(arch.type_vocab, arch.hidden)
        self.norm = nn.LayerNorm(arch.hidden, eps=arch.eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.word(input_ids) + self.position(pos)[None] + self.token_type.weight[0]
        return self.norm(h)


def pool(h: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """all-MiniLM's sentence embedding: masked mean over real tokens, unit length."""
    m = attention_mask.unsqueeze(-1).to(h.dtype)
    pooled = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
    return F.normalize(pooled, p=2.0, dim=-1)


class BertSupernet(nn.Module):
    def __init__(self, arch: BertArch = BertArch()) -> None:
        super().__init__()
        self.arch, self.space = arch, arch.space
        self.embeddings = Embeddings(arch)
        self.encoder = LayerSelect([ElasticLayer(arch.hidden, arch.heads, arch.ffn, arch.eps)
                                    for _ in range(arch.layers)], select=kept_layers)
        self.heads = nn.ModuleList(nn.Linear(arch.hidden, arch.classes)
                                   for _ in range(arch.layers))   # one per depth

    def widths(self, subnet: BertSubnet) -> tuple[int, int]:
        """(heads, FFN neurons) every layer of ``subnet`` runs."""
        return width_count(subnet.heads, self.arch.heads), width_count(subnet.ffn,
                                                                       self.arch.ffn)

    def forward(self, inputs: Inputs, subnet: BertSubnet) -> torch.Tensor:
        self.space.check(subnet)
        ids, keep = inputs["input_ids"], inputs["attention_mask"]
        h = self.embeddings(ids)
        h = self.encoder(h, subnet.depth, additive_mask(keep, h.dtype), *self.widths(subnet))
        return self.heads[subnet.depth - 1](pool(h, keep))

    def states(self, inputs: Inputs, subnet: BertSubnet
               ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(the output of every layer ``subnet`` runs, its logits): what distillation
        compares with the teacher's layer of the same index."""
        self.space.check(subnet)
        ids, keep = inputs["input_ids"], inputs["attention_mask"]
        h = self.embeddings(ids)
        mask, (heads, neurons) = additive_mask(keep, h.dtype), self.widths(subnet)
        out = []
        for i in kept_layers(self.arch.layers, subnet.depth):
            h = self.encoder.blocks[i](h, mask, heads, neurons)
            out.append(h)
        return out, self.heads[subnet.depth - 1](pool(h, keep))

    @torch.no_grad()
    def predict(self, inputs: Mapping[str, np.ndarray | torch.Tensor], subnet: BertSubnet,
                chunk: int = 64) -> np.ndarray:
        """Top-1 per row, computed in batches of similar length cut to their longest text
        (exact: trailing padding changes nothing), in the rows' order."""
        ids, keep = (torch.as_tensor(inputs[k]) for k in ("input_ids", "attention_mask"))
        order = torch.argsort(keep.sum(1), stable=True)
        out = torch.empty(len(ids), dtype=torch.int64)
        for start in range(0, len(ids), chunk):
            rows = order[start:start + chunk]
            batch = trim({"input_ids": ids[rows], "attention_mask": keep[rows]})
            out[rows] = self(batch, subnet).argmax(1)
        return out.numpy()

    def extract(self, subnet: BertSubnet) -> StaticBert:
        """``subnet`` as a standalone eval-mode module with its own copy of its weights."""
        self.space.check(subnet)
        heads, neurons = self.widths(subnet)
        layers = [StaticLayer(self.encoder.blocks[i], heads, neurons)
                  for i in kept_layers(self.arch.layers, subnet.depth)]
        emb = Embeddings(self.arch)
        emb.load_state_dict(self.embeddings.state_dict())
        head = nn.Linear(self.arch.hidden, self.arch.classes)
        head.load_state_dict(self.heads[subnet.depth - 1].state_dict())
        return StaticBert(emb, layers, head).eval()


class StaticBert(nn.Module):
    """One subnet of :class:`BertSupernet` in plain torch layers."""

    def __init__(self, embeddings: Embeddings, layers: Sequence[StaticLayer],
                 head: nn.Linear) -> None:
        super().__init__()
        self.embeddings, self.layers, self.head = embeddings, nn.ModuleList(layers), head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embeddings(input_ids)
        mask = additive_mask(attention_mask, h.dtype)
        for layer in self.layers:
            h = layer(h, mask)
        return self.head(pool(h, attention_mask))


def trim(inputs: Inputs) -> dict[str, torch.Tensor]:
    """``inputs`` without the trailing positions that are padding in every row."""
    keep = inputs["attention_mask"]
    real = torch.nonzero(keep.any(0))
    width = int(real.max()) + 1 if len(real) else 1
    return {k: v[:, :width] for k, v in inputs.items()}


_HF_LAYER = {  # ElasticLayer parameter -> BertLayer parameter (transformers' names)
    "attention.query": "attention.self.query", "attention.key": "attention.self.key",
    "attention.value": "attention.self.value", "attention.out": "attention.output.dense",
    "attention.norm": "attention.output.LayerNorm", "ffn.inner": "intermediate.dense",
    "ffn.outer": "output.dense", "ffn.norm": "output.LayerNorm"}
_HF_EMB = {"word": "word_embeddings", "position": "position_embeddings",
           "token_type": "token_type_embeddings", "norm": "LayerNorm"}


def arch_of(config, classes: int, **space) -> BertArch:
    """The arch of a ``transformers`` BertConfig (absolute positions, GELU)."""
    if config.hidden_act != "gelu" or getattr(config, "position_embedding_type",
                                              "absolute") != "absolute":
        raise ValueError("only BERT with GELU and absolute positions is supported")
    return BertArch(config.vocab_size, config.max_position_embeddings, config.type_vocab_size,
                    config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                    config.intermediate_size, config.layer_norm_eps, classes, **space)


@torch.no_grad()
def from_bert(embeddings: nn.Module, layers: Sequence[nn.Module], head: nn.Linear,
              arch: BertArch) -> BertSupernet:
    """A supernet holding a ``transformers`` BERT's weights (its ``embeddings`` and
    ``encoder.layer``) and ``head`` as every depth's head: its largest subnet computes
    what the BERT + masked mean + L2 + head computes."""
    net = BertSupernet(arch)
    src = embeddings.state_dict()
    net.embeddings.load_state_dict({f"{ours}.{p}": src[f"{theirs}.{p}"]
                                    for ours, theirs in _HF_EMB.items()
                                    for p in (("weight",) if ours != "norm"
                                              else ("weight", "bias"))})
    for block, layer in zip(net.encoder.blocks, layers, strict=True):
        src = layer.state_dict()
        block.load_state_dict({f"{ours}.{p}": src[f"{theirs}.{p}"]
                               for ours, theirs in _HF_LAYER.items() for p in ("weight", "bias")})
    for h in net.heads:
        h.load_state_dict(head.state_dict())
    return net
