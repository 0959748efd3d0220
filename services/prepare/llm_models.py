"""``offramp prepare`` for generative models: ``smollm2-135m`` (exit heads distilled from the
model itself, ``services.prepare.llm_heads``) and ``tiny-llm`` (made in seconds for tests:
random weights, untrained heads, which read the final head early).

Both leave ``<models_dir>/<name>/`` with a heads file named after its hash and an
``LlmManifest``; both are reused while intact and of the same recipe."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from services.prepare.staging import staged_folder
from services.runtime.llm_heads import RANK, ExitHeads, head_layers
from services.runtime.llm_manifest import LlmManifest, load_if_intact
from services.zoo import tiny_llm

TINY_RECIPE = "tiny-llm-1"  # bump when tiny_llm's model, tokenizer or heads change
TINY_HEADS = 2


def prepare_tiny(models_dir: Path, force: bool = False,
                 log: Callable[[str], None] = print) -> Path:
    target = Path(models_dir) / tiny_llm.NAME
    if not force and (m := load_if_intact(target, TINY_RECIPE)) is not None:
        log(f"reusing {tiny_llm.NAME} {m.version} at {target}")
        return target
    with staged_folder(target) as tmp:
        base = tiny_llm.save(tmp / "base")
        cfg = tiny_llm.config(1)  # only its shapes: the saved model is the one served
        layers = head_layers(cfg.num_hidden_layers, TINY_HEADS)
        heads = ExitHeads(cfg.hidden_size, layers)
        heads.save(tmp / "heads.pt")
        digest = hashlib.sha256((tmp / "heads.pt").read_bytes()).hexdigest()
        file = f"heads-{digest[:16]}.pt"
        (tmp / "heads.pt").rename(tmp / file)
        manifest = LlmManifest(
            tiny_llm.NAME, "", file, digest, {"fp32": str(target / base.name)},
            str(target / base.name), cfg.num_hidden_layers, cfg.hidden_size,
            len(tiny_llm.tokenizer()), layers, RANK, TINY_RECIPE,
            [{"layer": k, "agreement": {"all": None}, "thresholds": []} for k in layers],
            {"note": tiny_llm.DESCRIPTION})
        manifest.version = manifest.compute_version()
        manifest.save(tmp)
    log(f"prepared {tiny_llm.NAME} {manifest.version} at {target}")
    return target


def prepare_llm(name: str, cfg, force: bool = False, log: Callable[[str], None] = print,
                models_dir: Path | None = None) -> Path:
    """Prepare the generative model ``name`` (one of ``registry.LLMS``)."""
    if name == tiny_llm.NAME:
        return prepare_tiny(models_dir or cfg.models_dir, force, log)
    from services.prepare.llm_heads import prepare_configured

    return prepare_configured(cfg, force, log, models_dir)
