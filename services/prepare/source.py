"""Where a model to prepare comes from: a zoo entry, an ONNX file, or a torch model on disk.

Every source ends as one ONNX graph of the whole classifier plus what preparation needs
around it: input and output specs (batch axis excluded, -1 for variable dims), the class
count, and bootstrap inputs for ramp training. Zoo models bring their own data; a user's
model takes ``--data INPUTS.npz`` (one array per input name, first axis = samples) or
``.npy`` for a single input. Without bootstrap (``--no-bootstrap``) a user's data only
gives shapes and timing, so a few samples do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from services.runtime.input_files import InputFileError, read_arrays, read_inputs
from services.runtime.manifest import TensorSpec
from services.zoo.registry import ZOO, get_spec

# (inputs by name, group ids): groups keep held-out agreement honest (unseen scenes).
Batches = Iterator[tuple[dict[str, np.ndarray], np.ndarray]]
USER_GROUP = 50  # a user's data has no groups: runs of this many samples stand in
MIN_BOOTSTRAP = 200  # a user's samples below which ramps cannot be trained usefully
DEFAULT_MAX_RAMPS = 12


class SourceError(ValueError):
    """The model or its data cannot be used; the message says what to change."""


@dataclass
class ModelSource:
    name: str
    kind: str
    description: str
    model: onnx.ModelProto | None  # None: a zoo model not built yet (from_zoo(build=False))
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    classes: int
    base_params: int
    bootstrap: Callable[[int, int], Batches]  # (n, seed) -> chunks
    bootstrap_n: int
    sample: Callable[[int, int], dict[str, np.ndarray]]  # (n, seed) -> inputs
    pool: str = "gap"
    ramp_steps: int = 300
    ramp_targets: str = "top1"  # what ramps learn of the final model (ramps.TARGETS)
    max_ramps: int = DEFAULT_MAX_RAMPS
    recipe: str = ""  # what shapes the artifacts: a change invalidates a prepared copy
    mask_input: str = ""  # the model input "masked_mean" pooling reads (attention mask)


def _np_dtype(elem_type: int) -> str:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).str


def _spec(vi: onnx.ValueInfoProto) -> TensorSpec:
    t = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    return TensorSpec(vi.name, _np_dtype(t.elem_type), dims[1:])


def graph_io(model: onnx.ModelProto) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Request inputs (initializers excluded) and outputs of a graph, batch axis dropped."""
    inits = {t.name for t in model.graph.initializer}
    ins = [_spec(vi) for vi in model.graph.input if vi.name not in inits]
    outs = [_spec(vi) for vi in model.graph.output]
    if not ins or not outs:
        raise SourceError("the ONNX graph needs at least one input and one output")
    return ins, outs


def onnx_params(model: onnx.ModelProto) -> int:
    return int(sum(np.prod(t.dims, dtype=np.int64) for t in model.graph.initializer))


def classes_of(outputs: list[TensorSpec]) -> int:
    out = outputs[0]
    if len(out.shape) != 1 or out.shape[0] <= 1:
        raise SourceError(f"output {out.name!r} has shape {out.shape} per sample: a classifier "
                          "must output one logit vector (N x classes) first")
    return out.shape[0]


# ------------------------------------------------------------------ user data


def load_data(path: Path, inputs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """Bootstrap inputs from ``.npz`` (one array per input name) or ``.npy`` (one input)."""
    try:
        return read_inputs(path, inputs)
    except InputFileError as exc:
        raise SourceError(str(exc)) from None


def _data_fns(arrays: dict[str, np.ndarray]):
    n_all = len(next(iter(arrays.values())))

    def bootstrap(n: int, seed: int) -> Batches:
        n = min(n, n_all)
        for start in range(0, n, 64):
            stop = min(n, start + 64)
            yield ({k: v[start:stop] for k, v in arrays.items()},
                   np.arange(start, stop) // USER_GROUP)

    def sample(n: int, seed: int = 0) -> dict[str, np.ndarray]:
        idx = np.random.default_rng(seed).integers(0, n_all, n)
        return {k: v[idx] for k, v in arrays.items()}

    return bootstrap, sample, n_all


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------ sources


def from_zoo(name: str, build: bool = True) -> ModelSource:
    """A zoo model's source; ``build=False`` leaves the model out (``model`` None): all a
    check whether an intact copy can be reused needs, without building and exporting it
    (seconds for EfficientNet, the topic head's training on a new home for MiniLM)."""
    spec = get_spec(name)
    model, params = None, 0
    if build:
        from services.prepare.export import count_params, to_onnx  # torch: only when exporting

        built = spec.build()
        names = [t.name for t in spec.inputs]
        data = to_onnx(built.full, tuple(built.example[k] for k in names), names, ["logits"])
        model, params = onnx.load_from_string(data), count_params([built.full])
    return ModelSource(
        name=spec.name, kind=spec.kind, description=spec.description,
        model=model, inputs=list(spec.inputs),
        outputs=list(spec.outputs), classes=spec.classes,
        base_params=params, bootstrap=spec.bootstrap,
        bootstrap_n=spec.bootstrap_n, sample=spec.sample_inputs, pool=spec.pool,
        ramp_steps=spec.ramp_steps, ramp_targets=spec.ramp_targets, max_ramps=spec.max_ramps,
        recipe=spec.recipe, mask_input=spec.mask_input)


def from_onnx_file(path: Path, data: Path | None, name: str | None = None,
                   bootstrap: bool = True) -> ModelSource:
    path = Path(path)
    raw = path.read_bytes()
    try:
        model = onnx.load_from_string(raw)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types
        raise SourceError(f"{path} is not an ONNX model: {exc}") from None
    return _user_source(model, raw, data, name or path.stem, f"ONNX model {path.name}",
                        bootstrap)


def from_torch_path(path: Path, data: Path | None, name: str | None = None,
                    bootstrap: bool = True) -> ModelSource:
    """A TorchScript file, a whole pickled ``nn.Module``, or a Hugging Face model folder;
    exported to ONNX with example inputs taken from ``data``."""
    import torch

    from services.prepare.export import to_onnx

    path = Path(path)
    if data is None:
        raise SourceError(f"{path.name} is a torch model: pass --data INPUTS.npz (one array per "
                          "forward() argument, in order) so it can be traced and its ramps trained")
    arrays = _read_any(data)
    if path.is_dir():
        module = _hf_module(path, list(arrays))
    else:
        try:
            module = torch.jit.load(str(path), map_location="cpu")
        except Exception:  # noqa: BLE001 - not TorchScript: try a pickled module
            module = torch.load(str(path), map_location="cpu", weights_only=False)
        if not isinstance(module, torch.nn.Module):
            raise SourceError(f"{path} holds a {type(module).__name__}, not a torch module "
                              "(save the whole model, or TorchScript)")
    module.eval()
    names = list(arrays)
    example = tuple(torch.from_numpy(np.ascontiguousarray(arrays[k][:1])) for k in names)
    raw = to_onnx(module, example, names, ["logits"])
    return _user_source(onnx.load_from_string(raw), raw, data, name or path.stem,
                        f"torch model {path.name}", bootstrap)


def _read_any(data: Path) -> dict[str, np.ndarray]:
    try:
        return read_arrays(data, "input")
    except InputFileError as exc:
        raise SourceError(str(exc)) from None


def _hf_module(folder: Path, names: list[str]):
    """A Hugging Face classifier whose forward(*inputs) returns the logits; inputs are
    passed by the names of the data arrays (input_ids, attention_mask, pixel_values...)."""
    import torch

    if not (folder / "config.json").is_file():
        raise SourceError(f"{folder} is a folder without config.json: not a Hugging Face model")
    try:
        from transformers import AutoConfig, AutoModelForImageClassification
        from transformers import AutoModelForSequenceClassification as Seq
    except ImportError as exc:
        raise SourceError(f"loading {folder} needs transformers: {exc}") from None
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    loader = AutoModelForImageClassification if "pixel" in str(
        getattr(config, "main_input_name", "")) else Seq
    hf = loader.from_pretrained(folder, local_files_only=True, attn_implementation="eager")

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(**dict(zip(names, args, strict=True))).logits

    return LogitsOnly(hf).eval()


def _user_source(model: onnx.ModelProto, raw: bytes, data: Path | None, name: str,
                 description: str, train: bool = True) -> ModelSource:
    """``train``: the data are bootstrap inputs; else only shapes and timing read them."""
    inputs, outputs = graph_io(model)
    classes = classes_of(outputs)
    if data is None:
        if train:
            what, why = "bootstrap inputs", "ramps learn the model's own predictions on them"
        else:
            what, why = "a few sample inputs", "with --no-bootstrap they give shapes and timing"
        raise SourceError(f"{name}: pass --data INPUTS.npz with {what} (one array per input "
                          f"{[t.name for t in inputs]}, first axis = samples); {why}")
    arrays = load_data(data, inputs)
    bootstrap, sample, n = _data_fns(arrays)
    if train and n < MIN_BOOTSTRAP:
        raise SourceError(f"{Path(data).name} has {n} samples; ramps need at least "
                          f"{MIN_BOOTSTRAP} (a few thousand give useful agreement), or "
                          "--no-bootstrap for untrained ramps")
    digest = _digest(raw, Path(data).read_bytes())
    mask = mask_input_of(inputs)
    pool = "masked_mean" if mask else "mean"
    return ModelSource(
        name=name, kind="classifier", description=description, model=model, inputs=inputs,
        outputs=outputs, classes=classes, base_params=onnx_params(model),
        bootstrap=bootstrap, bootstrap_n=n, sample=sample,
        pool=pool, recipe=f"user:{digest}|pool={pool}", mask_input=mask)


def with_mask_input(src: ModelSource, mask: str) -> ModelSource:
    """``src`` with its text ramps' pooling chosen by hand (``offramp prepare --mask-input``):
    the mean over the real tokens that model input ``mask`` marks, or with ``none`` the
    plain mean over every position. Only models with a per-position input (one value per
    token: ``[S]``) take it: an image model's ramps average over space whatever is said."""
    positional = [t for t in src.inputs if len(t.shape) == 1]
    if not positional:
        shapes = ", ".join(f"{t.name} {t.shape}" for t in src.inputs)
        raise SourceError(f"--mask-input is for text models, whose ramps pool over token "
                          f"positions; {src.name} has no per-position input ({shapes})")
    if mask.lower() == "none":
        return replace(src, pool="mean", mask_input="", recipe=f"{src.recipe}|mask=none")
    spec = next((t for t in src.inputs if t.name == mask), None)
    if spec is None:
        raise SourceError(f"--mask-input {mask!r} is not an input of {src.name}; its inputs: "
                          f"{[t.name for t in src.inputs]} (or none: plain mean)")
    if len(spec.shape) != 1:
        raise SourceError(f"--mask-input {mask!r} has shape {spec.shape}, not one value per "
                          "token position")
    if np.dtype(spec.dtype).kind not in "iubf":
        raise SourceError(f"--mask-input {mask!r} is {spec.dtype}, not a numeric mask")
    return replace(src, pool="masked_mean", mask_input=mask, recipe=f"{src.recipe}|mask={mask}")


def mask_input_of(inputs: list[TensorSpec]) -> str:
    """The attention mask among a text model's inputs: an integer input named ``*mask*``
    of the same shape as another integer input (the token ids); "" if there is none. Its
    ramps then average over real tokens only (``masked_mean``)."""
    ints = [t for t in inputs if np.dtype(t.dtype).kind in "iub"]
    for t in ints:
        if "mask" in t.name.lower() and any(o is not t and o.shape == t.shape for o in ints):
            return t.name
    return ""


def check_name(name: str, target: str) -> None:
    """A name to serve a model under (``--name``): a plain folder name, and not another zoo
    model's, which ``offramp up`` would prepare over it."""
    if not name or "/" in name or name.startswith(".") or any(c.isspace() for c in name):
        raise SourceError(f"--name {name!r}: a plain name (no '/', spaces or leading dot)")
    if name in ZOO and name != target:
        raise SourceError(f"--name {name!r} is a zoo model's name; choose another")


def resolve(target: str, data: Path | None = None, name: str | None = None,
            bootstrap: bool = True, build: bool = True) -> ModelSource:
    """A zoo name, or a path to an ``.onnx`` file / torch model file / HF folder, served as
    ``name`` when given. ``bootstrap``: ``data`` must hold enough inputs to train ramps.
    ``build=False``: a zoo model comes without its model (``from_zoo``)."""
    if name is not None:
        check_name(name, target)
    path = Path(target)
    if path.exists():
        if path.suffix in (".npy", ".npz"):
            raise SourceError(f"{target} holds arrays, not a model: give an .onnx file, a "
                              "TorchScript or pickled torch module, or a Hugging Face folder "
                              "(inputs go in --data)")
        if path.suffix == ".onnx":
            return from_onnx_file(path, data, name, bootstrap)
        return from_torch_path(path, data, name, bootstrap)
    if target.endswith((".onnx", ".pt", ".pth")) or "/" in target:
        raise SourceError(f"{target} does not exist")
    src = from_zoo(target, build)
    return replace(src, name=name) if name else src
