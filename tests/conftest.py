"""Shared fixtures of integration and end-to-end tests: the zoo models, prepared once.
(Unit tests may not use them: tests/unit/conftest.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Where dev.sh prepared the zoo: the same default as services.common.config.
MODELS_DIR = Path(os.environ.get("OFFRAMP_MODELS_DIR")
                  or Path(os.environ.get("OFFRAMP_HOME") or Path.home() / ".offramp") / "models")


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """Zoo models prepared once (idempotent: reuses artifacts by hash; dev.sh prepares them)."""
    from services.prepare.pipeline import prepare  # unit runs load this file too: no torch

    for name in ("tiny", "efficientnet-lite0"):
        prepare(name, MODELS_DIR, log=lambda m: None)
    return MODELS_DIR


@pytest.fixture(scope="session")
def zoo_dir(models_dir) -> Path:
    """Every zoo model prepared (dev.sh prepares them all; idempotent)."""
    from services.prepare.pipeline import ZOO, prepare

    for name in ZOO:
        prepare(name, MODELS_DIR, log=lambda m: None)
    return MODELS_DIR


SUPERNET_TINY = "supernet-tiny"


def tiny_supernet_recipes():
    """(training recipe, search recipe) of the tiny supernet: seconds, not minutes."""
    from services.prepare.supernet import SearchRecipe
    from services.zoo import supernet_cnn

    return (supernet_cnn.Recipe(channels=(8, 16), max_depths=(2, 2), stem=8,
                                width_choices=(0.5, 1.0), steps=4, batch=16,
                                teacher="random-8M8-seed0"),
            SearchRecipe(random=6, mutations=2, calib=32, held_out=64))


@pytest.fixture(scope="session")
def supernet_dir(models_dir) -> Path:
    """A tiny supernet beside the zoo models, prepared in seconds by the real path: a few
    sandwich steps distilled from a fixed random teacher, then the pareto search
    (idempotent: reused while its recipe is the same)."""
    import torch

    from services.prepare.supernet import prepare_supernet
    from services.zoo import chain_cnn

    torch.manual_seed(0)
    teacher = chain_cnn.ChainCNN(layers=(8, "M", 8)).eval()
    recipe, search = tiny_supernet_recipes()
    prepare_supernet(MODELS_DIR, recipe=recipe, teacher=teacher, name=SUPERNET_TINY,
                     search=search, log=lambda m: None)
    return MODELS_DIR


def llm_twin(models_dir: Path, name: str, source: str = "tiny-llm",
             tokenizer_change: bool = False, perturb: bool = False) -> Path:
    """A prepared generative model copied under another candidate name (same weights, so
    same tokens); with ``tokenizer_change`` it gets its own base folder whose tokenizer
    differs (another family); with ``perturb`` its own base folder whose weights differ
    (same tokenizer: another candidate of the family, with other tokens)."""
    import json
    import shutil

    from services.runtime.manifest import MANIFEST_FILE

    shutil.copytree(models_dir / source, models_dir / name)
    path = models_dir / name / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["name"] = name
    if tokenizer_change:
        base = models_dir / name / "base"
        tok = json.loads((base / "tokenizer.json").read_text())
        tok["added_tokens"] = [*tok.get("added_tokens", []), {
            "id": 10**5, "content": "<extra>", "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True}]
        (base / "tokenizer.json").write_text(json.dumps(tok))
        manifest["base"] = {"fp32": str(base)}
        manifest["tokenizer"] = str(base)
    if perturb:
        import torch
        from transformers import AutoModelForCausalLM

        base = models_dir / name / "base"
        model = AutoModelForCausalLM.from_pretrained(manifest["base"]["fp32"],
                                                     dtype=torch.float32)
        with torch.no_grad():
            for p in model.model.layers[-1].parameters():
                p.mul_(-1.5)
        model.save_pretrained(base)
        manifest["base"] = {"fp32": str(base)}
    path.write_text(json.dumps(manifest))
    return models_dir / name
