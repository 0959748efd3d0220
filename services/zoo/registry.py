"""The models offramp can prepare, and realistic inputs for each.

Kept light to import: torch-based builders load only when a model is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from services.runtime.manifest import TensorSpec

RECIPE_VERSION = "8"  # bump when preparation changes in a way that alters artifacts

# (inputs by name, group ids): groups keep held-out data honest (e.g. unseen scenes).
Batches = Iterator[tuple[dict[str, np.ndarray], np.ndarray]]


@dataclass
class Built:
    full: object  # torch nn.Module: the whole classifier, exported to ONNX as one graph
    example: dict[str, object] = field(default_factory=dict)  # batch-1 torch inputs


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    classes: int
    build: Callable[[], Built]
    sample_inputs: Callable[[int, int], dict[str, np.ndarray]]
    bootstrap: Callable[[int, int], Batches]  # (n, seed) -> chunks
    bootstrap_n: int
    pool: str = "gap"  # N x S x H activations: "mean", "first" token or "masked_mean"
    ramp_steps: int = 300  # full-batch optimiser steps per ramp fit
    ramp_targets: str = "top1"  # what ramps learn of the final model (ramps.TARGETS)
    max_ramps: int = 12  # candidate ramp sites kept (evenly spaced) of all the graph offers
    recipe: str = ""  # what shapes the artifacts; a change invalidates prepared copies
    mask_input: str = ""  # the model input "masked_mean" pooling reads


# --- efficientnet-lite0 ---------------------------------------------------------------


def _effnet_build() -> Built:
    import torch

    from services.zoo import efficientnet as eff

    model = eff.load_model()
    shape = (1, 3, eff.IMAGE_SIZE, eff.IMAGE_SIZE)
    return Built(model, {"image": torch.zeros(shape, dtype=torch.uint8)})


def _effnet_sample(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    from services.workloads.frames import video_frames

    return {"image": video_frames(n, seed=seed, dtype="uint8")}


def _effnet_bootstrap(n: int, seed: int) -> Batches:
    from services.workloads.frames import iter_video_frames

    for frames, scenes in iter_video_frames(n, seed=seed, chunk=32, dtype="uint8"):
        yield {"image": frames}, scenes


# --- tiny -----------------------------------------------------------------------------


def _tiny_build() -> Built:
    import torch

    from services.zoo import tiny

    model = tiny.build_model()
    return Built(model, {"x": torch.zeros(1, tiny.IN_FEATURES)})


def _tiny_sample(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    from services.zoo import tiny

    return tiny.sample_inputs(n, seed)


def _tiny_bootstrap(n: int, seed: int) -> Batches:
    x = _tiny_sample(n, seed)["x"]
    for start in range(0, n, 256):
        chunk = x[start : start + 256]
        # Groups of 50 consecutive samples: a contiguous held-out split.
        yield {"x": chunk}, np.arange(start, start + len(chunk)) // 50


# --- minilm-topics ----------------------------------------------------------------------


def _minilm_build() -> Built:
    import torch

    from services.zoo import minilm_topics as mt

    model = mt.build_model()
    zeros = torch.zeros(1, mt.SEQ_LEN, dtype=torch.int64)
    return Built(model, {"input_ids": zeros, "attention_mask": torch.ones_like(zeros)})


def _minilm_sample(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    from services.zoo import minilm_topics as mt

    return mt.sample_inputs(n, seed)


def _minilm_bootstrap(n: int, seed: int) -> Batches:
    from services.zoo import minilm_topics as mt

    return mt.bootstrap(n, seed)


def _minilm_spec() -> ModelSpec:
    from services.zoo import minilm_topics as mt  # light: no torch at import

    return ModelSpec(
        name="minilm-topics",
        kind="classifier",
        description=f"MiniLM-L6 BERT (pretrained, PyPI) + a topic head trained on Debian "
                    f"fortunes, {mt.CLASSES} topics, {mt.SEQ_LEN} tokens",
        inputs=(TensorSpec("input_ids", "<i8", [mt.SEQ_LEN]),
                TensorSpec("attention_mask", "<i8", [mt.SEQ_LEN])),
        outputs=(TensorSpec("logits", "<f4", [mt.CLASSES]),),
        classes=mt.CLASSES,
        build=_minilm_build,
        sample_inputs=_minilm_sample,
        bootstrap=_minilm_bootstrap,
        bootstrap_n=13000,  # capped: the training split + distillation texts (12,234)
        pool="masked_mean",
        ramp_targets="softmax",
        mask_input="attention_mask",
        recipe=f"mmean_fc;distill=other-topics;{mt.HEAD_RECIPE}",
    )


# --- chain-cnn --------------------------------------------------------------------------


def _chain_build() -> Built:
    import torch

    from services.zoo import chain_cnn

    return Built(chain_cnn.build_model(), {"image": torch.zeros(1, *chain_cnn.IMAGE_SHAPE)})


def _chain_sample(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    from services.zoo import chain_cnn

    return chain_cnn.sample_inputs(n, seed)


def _chain_bootstrap(n: int, seed: int) -> Batches:
    from services.zoo import chain_cnn

    return chain_cnn.bootstrap(n, seed)


def _chain_spec() -> ModelSpec:
    from services.zoo import chain_cnn

    return ModelSpec(
        name="chain-cnn",
        kind="classifier",
        description=chain_cnn.DESCRIPTION,
        inputs=(TensorSpec("image", "<f4", list(chain_cnn.IMAGE_SHAPE)),),
        outputs=(TensorSpec("logits", "<f4", [chain_cnn.CLASSES]),),
        classes=chain_cnn.CLASSES,
        build=_chain_build,
        sample_inputs=_chain_sample,
        bootstrap=_chain_bootstrap,
        bootstrap_n=4000,
        recipe=f"gap_fc;{chain_cnn.RECIPE.digest()}",
    )


_FACTORIES: dict[str, Callable[[], ModelSpec]] = {
    "efficientnet-lite0": lambda: ModelSpec(
        name="efficientnet-lite0",
        kind="classifier",
        description="EfficientNet-Lite0, ImageNet-1k, 4.65 M params, uint8 RGB pixels",
        inputs=(TensorSpec("image", "|u1", [3, 224, 224]),),
        outputs=(TensorSpec("logits", "<f4", [1000]),),
        classes=1000,
        build=_effnet_build,
        sample_inputs=_effnet_sample,
        bootstrap=_effnet_bootstrap,
        # 16,000 frames: the ramps see four times the crops of the 19 photos a stream shows.
        # On three default video streams (replay) that moved the ramps' agreement with the
        # final model up by 1-14 points and offramp's mean saving from 8-14 % to 21-28 %,
        # for about three more minutes of preparation.
        bootstrap_n=16000,
        recipe="gap_fc;video-frames;uint8-pixels",
    ),
    "tiny": lambda: ModelSpec(
        name="tiny",
        kind="classifier",
        description="MLP 16 -> 32 x4 -> 10 for overhead tests",
        inputs=(TensorSpec("x", "<f4", [16]),),
        outputs=(TensorSpec("logits", "<f4", [10]),),
        classes=10,
        build=_tiny_build,
        sample_inputs=_tiny_sample,
        bootstrap=_tiny_bootstrap,
        bootstrap_n=2000,
        ramp_steps=150,
        recipe="mlp16-32x4-10;fc",
    ),
    "minilm-topics": _minilm_spec,
    "chain-cnn": _chain_spec,
}




class _Zoo(Mapping[str, ModelSpec]):
    """Model names are known up front; a spec is built on first use, so listing the zoo
    (the CLI, the router) never imports torch or a model's own modules."""

    def __init__(self, factories: dict[str, Callable[[], ModelSpec]]) -> None:
        self._factories = factories
        self._built: dict[str, ModelSpec] = {}

    def __getitem__(self, name: str) -> ModelSpec:
        if name not in self._built:
            self._built[name] = self._factories[name]()
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)

    def __len__(self) -> int:
        return len(self._factories)


ZOO = _Zoo(_FACTORIES)
# Supernets the project makes: prepared by services.prepare.supernet, served by variant
# (their own path: no ramps, a torch artifact); named here so the CLI and the launcher
# know them without importing torch.
SUPERNETS = ("supernet-cnn", "supernet-minilm")
# Generative models (kind "llm", prepared by services.prepare.llm_models on demand): the
# folder holds exit heads, the base model stays in its cache; tiny-llm is made for tests.
# smollm2-135m-pruned is a lossy derivative of it (services.prepare.llm_pruned), a second
# HELIOS candidate of its tokenizer.
LLMS = ("smollm2-135m", "smollm2-135m-pruned", "tiny-llm")


def get_spec(name: str) -> ModelSpec:
    try:
        return ZOO[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(sorted(ZOO))} (classifiers), "
            f"{', '.join(SUPERNETS)} (supernets), {', '.join(LLMS)} (generative); or a path "
            "to a model.onnx, a torch module file or a Hugging Face model folder"
        ) from None


def sample_inputs(name: str, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """n realistic inputs for a zoo model (video frames, random vectors, ...)."""
    return get_spec(name).sample_inputs(n, seed)
