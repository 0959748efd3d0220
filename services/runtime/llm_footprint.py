"""A prepared generative model as a HELIOS model-repository candidate: its memory footprint,
read from the saved weights' safetensors headers and the model's config without loading
anything (no torch).

Bytes are those the worker holds (fp32, as preparation caches the base): one transformer
layer's weights, what stays resident at any depth (embeddings, final norm, LM head, exit
heads), and KV per token and layer. The family is the tokenizer's content hash: candidates
whose perplexities compare share it (004 App. A).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path
from typing import Any

from services.runtime.llm_manifest import LlmManifest

LAYER = re.compile(r"^model\.layers\.(\d+)\.")
FP32_BYTES = 4
# No offline benchmark ships with a prepared model: every candidate starts equal, and the
# first assessment's PHT rows (measured on the served stream) decide.
UNPROFILED = {"tokens_per_s": 1.0, "perplexity": 1.0}


def tensor_bytes(folder: Path) -> dict[str, int]:
    """Bytes of every tensor in the safetensors files of ``folder`` (headers only)."""
    sizes: dict[str, int] = {}
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {folder}")
    for file in files:
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, spec in header.items():
            if name != "__metadata__":
                start, end = spec["data_offsets"]
                sizes[name] = int(end) - int(start)
    return sizes


def family(tokenizer_folder: Path) -> str:
    """The tokenizer's content hash: candidates of one family share token ids."""
    path = Path(tokenizer_folder) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {tokenizer_folder}")
    return "tok-" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def candidate_row(model_dir: Path) -> dict[str, Any]:
    """The repository row (``Store.save_repository_candidates``) of the prepared generative
    model in ``model_dir``."""
    m = LlmManifest.load(model_dir)
    base = Path(m.base["fp32"])
    sizes = tensor_bytes(base)
    per_layer: dict[int, int] = {}
    for name, size in sizes.items():
        if (hit := LAYER.match(name)) is not None:
            per_layer[int(hit.group(1))] = per_layer.get(int(hit.group(1)), 0) + size
    if len(per_layer) != m.n_layers:
        raise ValueError(f"{m.name}: {len(per_layer)} layers in {base}, manifest says "
                         f"{m.n_layers}")
    heads_file = Path(model_dir) / m.heads_file
    fixed = sum(sizes.values()) - sum(per_layer.values()) + heads_file.stat().st_size
    cfg = json.loads((base / "config.json").read_text(encoding="utf-8"))
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    return {"name": m.name, "family": family(Path(m.tokenizer)), "n_layers": m.n_layers,
            "exit_layers": sorted({*m.head_layers, m.n_layers}),
            "layer_bytes": max(per_layer.values()), "fixed_bytes": fixed,
            "kv_bytes_per_token_layer": 2 * kv_heads * head_dim * FP32_BYTES,
            **UNPROFILED, "exit_distribution": None,
            "benchmarks": {"offline": "none: candidates rank equal until an assessment "
                                      "measures them", "version": m.version},
            "path": str(Path(model_dir))}
