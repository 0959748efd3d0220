"""What the router knows of a model: its input/output contract, checked on every request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schemas import errors
from schemas.errors import ServingError
from services.common.config import Config
from services.runtime.manifest import Manifest, manifest_kind


@dataclass(frozen=True)
class TensorContract:
    name: str
    dtype: str
    shape: tuple[int, ...]   # per sample; -1 = variable

    def describe(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    inputs: tuple[TensorContract, ...]
    outputs: tuple[TensorContract, ...]
    classes: int
    full_ms: float

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    def describe(self) -> dict:
        return {"name": self.name, "inputs": [t.describe() for t in self.inputs],
                "outputs": [t.describe() for t in self.outputs], "classes": self.classes}

    def check_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        """Raise ``bad_request`` unless ``inputs`` is exactly one sample of this model's inputs."""
        expected = {t.name: t for t in self.inputs}
        extra = set(inputs) - set(expected)
        if extra:
            raise ServingError(errors.BAD_REQUEST, f"unexpected input(s) {sorted(extra)} for model "
                               f"{self.name!r}; it takes {sorted(expected)}")
        for name, spec in expected.items():
            arr = inputs.get(name)
            if arr is None:
                raise ServingError(errors.BAD_REQUEST, f"missing input {name!r} for model {self.name!r}")
            if arr.dtype.str != np.dtype(spec.dtype).str:
                raise ServingError(errors.BAD_REQUEST, f"input {name!r} has dtype {arr.dtype.str!r}; "
                                   f"model {self.name!r} needs {spec.dtype!r}")
            if len(arr.shape) != len(spec.shape) or any(
                    want not in (-1, got) for want, got in zip(spec.shape, arr.shape)):
                raise ServingError(errors.BAD_REQUEST, f"input {name!r} has shape {list(arr.shape)}; "
                                   f"model {self.name!r} needs {list(spec.shape)} (one sample, no batch axis)")


def spec_from_manifest(m: Manifest) -> ModelSpec:
    def contract(t) -> TensorContract:
        return TensorContract(t.name, t.dtype, tuple(int(d) for d in t.shape))

    return ModelSpec(name=m.name, inputs=tuple(contract(t) for t in m.inputs),
                     outputs=tuple(contract(t) for t in m.outputs), classes=int(m.classes),
                     full_ms=float(getattr(m, "full_ms", 0.0) or 0.0))


LLM_KIND = "llm"  # a generative model's manifest: served on offramp.generate.<model>


def _kind(cfg: Config, name: str) -> str:
    kind = manifest_kind(cfg.models_dir / name)
    if kind is None:
        raise SystemExit(f"model {name!r} is not prepared in {cfg.models_dir}: "
                         f"run `offramp prepare {name}`")
    return kind


def load_specs(cfg: Config) -> dict[str, ModelSpec]:
    """The classifiers among the served models (``offramp.infer.<model>``)."""
    return {name: spec_from_manifest(Manifest.load(cfg.models_dir / name))
            for name in cfg.models if _kind(cfg, name) != LLM_KIND}


def llm_models(cfg: Config) -> set[str]:
    """The generative models among the served models (``offramp.generate.<model>``)."""
    return {name for name in cfg.models if _kind(cfg, name) == LLM_KIND}
