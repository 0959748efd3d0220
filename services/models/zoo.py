"""The models offramp can prepare, and realistic inputs for each.

Kept light to import: torch-based builders load only when a model is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from services.models.manifest import TensorSpec

RECIPE_VERSION = "3"  # bump when preparation changes in a way that alters artifacts

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
    pool: str = "gap"  # for N x S x H activations: "mean" or "first" token
    ramp_steps: int = 300  # full-batch optimiser steps per ramp fit
    max_ramps: int = 12  # candidate ramp sites kept (evenly spaced) of all the graph offers
    recipe: str = ""  # what shapes the artifacts; a change invalidates prepared copies


# --- efficientnet-lite0 ---------------------------------------------------------------


def _effnet_build() -> Built:
    import torch

    from services.models import efficientnet as eff

    model = eff.load_model()
    shape = (1, 3, eff.IMAGE_SIZE, eff.IMAGE_SIZE)
    return Built(model, {"image": torch.zeros(shape)})


def _effnet_sample(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    from services.models.workloads import video_frames

    return {"image": video_frames(n, seed=seed)}


def _effnet_bootstrap(n: int, seed: int) -> Batches:
    from services.models.workloads import iter_video_frames

    for frames, scenes in iter_video_frames(n, seed=seed, chunk=32):
        yield {"image": frames}, scenes


# --- tiny -----------------------------------------------------------------------------


def _tiny_build() -> Built:
    import torch

    from services.models import tiny

    model = tiny.build_model()
    return Built(model, {"x": torch.zeros(1, tiny.IN_FEATURES)})


def _tiny_sample(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    from services.models import tiny

    return tiny.sample_inputs(n, seed)


def _tiny_bootstrap(n: int, seed: int) -> Batches:
    x = _tiny_sample(n, seed)["x"]
    for start in range(0, n, 256):
        chunk = x[start : start + 256]
        # Groups of 50 consecutive samples: a contiguous held-out split.
        yield {"x": chunk}, np.arange(start, start + len(chunk)) // 50


ZOO: dict[str, ModelSpec] = {
    "efficientnet-lite0": ModelSpec(
        name="efficientnet-lite0",
        kind="classifier",
        description="EfficientNet-Lite0, ImageNet-1k, 4.65 M params",
        inputs=(TensorSpec("image", "<f4", [3, 224, 224]),),
        outputs=(TensorSpec("logits", "<f4", [1000]),),
        classes=1000,
        build=_effnet_build,
        sample_inputs=_effnet_sample,
        bootstrap=_effnet_bootstrap,
        bootstrap_n=4000,
        recipe="gap_fc;video-frames",
    ),
    "tiny": ModelSpec(
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
}


def get_spec(name: str) -> ModelSpec:
    try:
        return ZOO[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(sorted(ZOO))}"
        ) from None


def sample_inputs(name: str, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """n realistic inputs for a zoo model (video frames, random vectors, ...)."""
    return get_spec(name).sample_inputs(n, seed)
