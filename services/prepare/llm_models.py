"""``offramp prepare`` for generative models: ``smollm2-135m`` (exit heads distilled from the
model itself, ``services.prepare.llm_heads``) and ``tiny-llm`` (made in seconds for tests:
random weights, untrained heads, which read the final head early).

Both leave ``<models_dir>/<name>/`` with a heads file named after its hash and an
``LlmManifest``; both are reused while intact and of the same recipe."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from services.prepare import llm_pruned
from services.prepare.llm_heads import prepare_configured, write_artifact
from services.runtime.llm_heads import RANK, ExitHeads, head_layers
from services.runtime.llm_manifest import load_if_intact
from services.zoo import tiny_llm

TINY_RECIPE = "tiny-llm-1"  # bump when tiny_llm's model, tokenizer or heads change
TINY_HEADS = 2


def prepare_tiny(models_dir: Path, force: bool = False,
                 log: Callable[[str], None] = print) -> Path:
    target = Path(models_dir) / tiny_llm.NAME
    if not force and (m := load_if_intact(target, TINY_RECIPE)) is not None:
        log(f"reusing {tiny_llm.NAME} {m.version} at {target}")
        return target
    cfg = tiny_llm.config(1)  # only its shapes: the saved model is the one served
    layers = head_layers(cfg.num_hidden_layers, TINY_HEADS)
    base = str(target / "base")
    manifest = write_artifact(target, ExitHeads(cfg.hidden_size, layers), {
        "name": tiny_llm.NAME, "base": {"fp32": base}, "tokenizer": base,
        "n_layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
        "vocab": len(tiny_llm.tokenizer()), "head_layers": layers, "head_rank": RANK,
        "recipe": TINY_RECIPE,
        "heads": [{"layer": k, "agreement": {"all": None}, "thresholds": []} for k in layers],
        "meta": {"note": tiny_llm.DESCRIPTION}}, extra=lambda tmp: tiny_llm.save(tmp / "base"))
    log(f"prepared {tiny_llm.NAME} {manifest.version} at {target}")
    return target


def prepare_llm(name: str, cfg, force: bool = False, log: Callable[[str], None] = print,
                models_dir: Path | None = None) -> Path:
    """Prepare the generative model ``name`` (one of ``registry.LLMS``)."""
    if name == tiny_llm.NAME:
        return prepare_tiny(models_dir or cfg.models_dir, force, log)
    if name == llm_pruned.NAME:
        return llm_pruned.prepare_configured(cfg, force, log, models_dir)
    return prepare_configured(cfg, force, log, models_dir)
