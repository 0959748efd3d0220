"""Training a transformer supernet from its own full model, as DynaBERT does (Hou et al.
2020): rewire heads and neurons by importance, then distil every width and depth from the
full model with the sandwich rule. Data-agnostic: the zoo module
(:mod:`services.zoo.supernet_minilm`) brings the corpus, the recipe and the cache.

- ``length_batches``: training rows in batches of similar length, cut to their longest
  row (trailing padding changes nothing, and fortunes quotes average 28 of 64 tokens);
- ``rewire``: importance of every head and FFN neuron (see ``bert_ops``) accumulated over
  labelled batches, then each layer reordered so slices keep the most important;
- ``depth_features``: pooled sentence embeddings of one depth, for fitting its head;
- ``distill``: per step, the largest, the smallest and ``middle`` random subnets, each on
  soft cross-entropy to the teacher's logits plus the mean squared error of every layer
  it runs against the teacher's layer of the same index, over real tokens (DynaBERT's
  logits + hidden-state loss; embeddings are frozen, so their loss is zero).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from services.supernet.bert_subnet import BertSubnet, kept_layers
from services.supernet.bert_supernet import BertSupernet, pool, trim
from services.training.adam import Adam

Encoded = Mapping[str, np.ndarray]   # {"input_ids", "attention_mask"}: N x S int64


def length_batches(inputs: Encoded, size: int, rng: np.random.Generator,
                   labels: np.ndarray | None = None
                   ) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor | None]]:
    """Every row once, in batches of ``size`` rows of similar length (sorted within
    windows of 16 batches, batch order shuffled), trimmed; with their labels."""
    n = len(inputs["input_ids"])
    lengths = np.asarray(inputs["attention_mask"]).sum(1)
    perm = rng.permutation(n)
    window = 16 * size
    order = np.concatenate([perm[i:i + window][np.argsort(lengths[perm[i:i + window]],
                                                          kind="stable")]
                            for i in range(0, n, window)]) if n else perm
    starts = list(range(0, n - size + 1, size)) or ([0] if n else [])
    for start in rng.permutation(starts):
        rows = order[start:start + size]
        batch = trim({k: torch.from_numpy(np.asarray(v)[rows]) for k, v in inputs.items()})
        yield batch, None if labels is None else torch.from_numpy(labels[rows])


def rewire(net: BertSupernet, batches, log: Callable[[str], None] | None = None) -> None:
    """Reorder every layer's heads and FFN neurons by importance (most important first),
    measured as summed ``|dL/dmask|`` of the cross-entropy to the labels over
    ``batches`` of (inputs, labels). The full model computes the same after it."""
    blocks = net.encoder.blocks
    heads = [torch.zeros(net.arch.heads) for _ in blocks]
    neurons = [torch.zeros(net.arch.ffn) for _ in blocks]
    largest = net.space.largest
    params = [p for b in blocks for p in (b.attention.out.weight, b.ffn.outer.weight)]
    was = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    try:
        with torch.enable_grad():
            for x, y in batches:
                for p in params:
                    p.grad = None
                F.cross_entropy(net(x, largest), y, reduction="sum").backward()
                for k, b in enumerate(blocks):
                    heads[k] += b.attention.importance().abs().detach()
                    neurons[k] += b.ffn.importance().abs().detach()
    finally:
        for p, w in zip(params, was, strict=True):
            p.grad = None
            p.requires_grad_(w)
    for k, b in enumerate(blocks):
        b.attention.reorder(torch.argsort(heads[k], descending=True, stable=True))
        b.ffn.reorder(torch.argsort(neurons[k], descending=True, stable=True))
    if log:
        kept = [float(h.sort(descending=True).values[: len(h) // 2].sum() / h.sum())
                for h in heads]
        log(f"rewired: the top half of the heads holds {min(kept):.0%}-{max(kept):.0%} of "
            "each layer's head importance")


@torch.no_grad()
def depth_features(net: BertSupernet, inputs: Encoded, depth: int, chunk: int = 64
                   ) -> np.ndarray:
    """Pooled (masked mean, unit length) embeddings of ``inputs`` after the layers a
    full-width subnet of ``depth`` runs: what that depth's head sees."""
    ids, keep = (torch.from_numpy(np.asarray(inputs[k])) for k in ("input_ids",
                                                                   "attention_mask"))
    order = torch.argsort(keep.sum(1), stable=True)
    out = np.zeros((len(ids), net.arch.hidden), np.float32)
    subnet = BertSubnet(depth, net.space.largest.heads, net.space.largest.ffn)
    for start in range(0, len(ids), chunk):
        rows = order[start:start + chunk]
        x = trim({"input_ids": ids[rows], "attention_mask": keep[rows]})
        states, _ = net.states(x, subnet)
        out[rows.numpy()] = pool(states[-1], x["attention_mask"]).numpy()
    return out


@dataclass(frozen=True)
class DistillConfig:
    steps: int
    lr: Callable[[int], float]   # learning rate at each step
    middle: int = 2              # random subnets per step besides the largest and smallest
    hidden: float = 1.0          # weight of the hidden-state loss against the logits'
    weight_decay: float = 0.0


def distill(net: BertSupernet, teacher: BertSupernet, batches, cfg: DistillConfig,
            rng: np.random.Generator, log: Callable[[str], None] | None = None) -> float:
    """Train ``net``'s layers and heads (embeddings frozen) for ``cfg.steps`` batches of
    ``batches`` (inputs, _); returns the last step's loss."""
    for p in net.parameters():
        p.requires_grad_(False)
    params = [p for m in (net.encoder, net.heads) for p in m.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = Adam(params, cfg.lr, weight_decay=cfg.weight_decay)
    net.train()
    started, loss = time.monotonic(), torch.zeros(())
    for step, (x, _) in zip(range(cfg.steps), batches, strict=False):
        with torch.no_grad():
            t_states, t_logits = teacher.states(x, teacher.space.largest)
        soft = F.softmax(t_logits, dim=1)
        real = x["attention_mask"].unsqueeze(-1).to(t_logits.dtype)
        for subnet in net.space.sandwich(rng, cfg.middle):
            states, logits = net.states(x, subnet)
            loss = -(soft * F.log_softmax(logits, dim=1)).sum(1).mean()
            kept = kept_layers(net.arch.layers, subnet.depth)
            for i, h in zip(kept, states, strict=True):
                err = ((h - t_states[i]) ** 2 * real).sum() / (real.sum() * h.shape[-1])
                loss = loss + cfg.hidden * err / len(kept)
            loss.backward()
        opt.step()
        opt.zero_grad()
        if log and (step + 1) % 20 == 0:
            log(f"distillation: step {step + 1}/{cfg.steps} loss {loss.item():.4f} "
                f"({time.monotonic() - started:.0f} s)")
    for p in params:
        p.requires_grad_(False)
    net.eval()
    return float(loss.item())
