"""Greedy partial loading (HELIOS §3.3.3): only the decoder layers up to a depth hold their
weights; the rest are released, and read back from the model's saved weights when a deeper
depth is needed.

Works on a Hugging Face Llama-family model whose weights were saved as safetensors
(``save_pretrained``: ``model.safetensors`` or its shards), as preparation saves the fp32
base. A released layer's parameters become empty tensors, so its memory is returned; the
module stays in place, and ``LlmDecoder`` never calls a layer above its depth. Restoring
reads only that layer's tensors from the file (memory-mapped).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

PREFIX = "model.layers."


@dataclass(frozen=True)
class Move:
    """What one ``load_to`` did: the depth now resident, bytes read and freed, time spent."""

    depth: int
    loaded_bytes: int
    freed_bytes: int
    ms: float


def _files(folder: Path) -> list[Path]:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {folder}: partial loading reads "
                                "layers back from them")
    return files


class LayerLoader:
    """Keeps layers ``1..depth`` of ``model`` resident (1-based, as exit depths)."""

    def __init__(self, model: nn.Module, folder: Path) -> None:
        self.layers = model.model.layers
        self.n_layers = len(self.layers)
        self.where: dict[str, Path] = {}
        from safetensors import safe_open

        for file in _files(folder):
            with safe_open(str(file), "pt") as f:
                names = f.keys()  # a safetensors handle lists its tensors, not iterates
                self.where.update({k: file for k in names if k.startswith(PREFIX)})

    def resident(self, layer: int) -> bool:
        return all(p.numel() > 0 for p in self.layers[layer - 1].parameters())

    def resident_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for layer in self.layers
                   for p in layer.parameters())

    def load_to(self, depth: int) -> Move:
        """Make layers ``1..depth`` resident and release the rest."""
        if not 1 <= depth <= self.n_layers:
            raise ValueError(f"depth {depth} outside 1..{self.n_layers}")
        started = time.perf_counter()
        loaded = freed = 0
        for layer in range(1, self.n_layers + 1):
            if layer <= depth and not self.resident(layer):
                loaded += self._restore(layer)
            elif layer > depth and self.resident(layer):
                freed += self._release(layer)
        return Move(depth, loaded, freed, (time.perf_counter() - started) * 1e3)

    def _release(self, layer: int) -> int:
        freed = 0
        for p in self.layers[layer - 1].parameters():
            freed += p.numel() * p.element_size()
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        return freed

    def _restore(self, layer: int) -> int:
        from safetensors import safe_open

        module = self.layers[layer - 1]
        names = dict(module.named_parameters())
        by_file: dict[Path, list[str]] = {}
        for name in names:
            key = f"{PREFIX}{layer - 1}.{name}"
            if key not in self.where:
                raise KeyError(f"layer {layer}'s {name} is not in the saved weights")
            by_file.setdefault(self.where[key], []).append(name)
        read = 0
        for file, wanted in by_file.items():
            with safe_open(str(file), "pt") as f:
                for name in wanted:
                    tensor = f.get_tensor(f"{PREFIX}{layer - 1}.{name}")
                    names[name].data = tensor.to(names[name].dtype)
                    read += tensor.numel() * tensor.element_size()
        return read
