"""A model's inputs read from a user's ``.npy`` or ``.npz`` file, with errors that say what
to change: what ``prepare --data``, ``trace record --inputs`` and ``infer --input`` read."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from services.runtime.manifest import TensorSpec


class InputFileError(ValueError):
    """An input file that is missing, unreadable or does not fit the model."""


def read_arrays(path: Path, npy_name: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` by name, or an ``.npy``'s one array as ``npy_name``."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"input file {path} does not exist")
    try:
        data = np.load(path, allow_pickle=False)
        if not hasattr(data, "files"):
            return {npy_name: data}
        with data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        # numpy takes any file that is not an array file for a pickle: say what it is not
        why = "" if "pickle" in str(exc) else f" ({exc})"
        raise InputFileError(f"{path} is not a readable .npy or .npz file of plain arrays"
                             f"{why}") from None


def read_inputs(path: Path, inputs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """Samples for a model from ``.npz`` (one array per input name) or ``.npy`` (one input),
    first axis = samples, cast to the inputs' dtypes."""
    path = Path(path)
    names = [t.name for t in inputs]
    if path.suffix == ".npy" and len(names) != 1:
        raise InputFileError(f"{path.name} holds one array but the model takes {names}: "
                             "use an .npz with one array per input name")
    arrays = read_arrays(path, names[0])
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputFileError(f"{path.name} lacks arrays for inputs {missing}; it has "
                             f"{sorted(arrays)} (one array per model input name)")
    arrays = {n: arrays[n] for n in names}
    counts = {len(a) if a.ndim else 0 for a in arrays.values()}
    if len(counts) != 1 or 0 in counts:
        raise InputFileError(f"{path.name}: every array needs the same number of samples on "
                             f"axis 0, got {({k: a.shape for k, a in arrays.items()})}")
    for t in inputs:
        a = arrays[t.name]
        fixed = [(d, s) for d, s in zip(t.shape, a.shape[1:], strict=False) if d != -1 and d != s]
        if a.ndim - 1 != len(t.shape) or fixed:
            raise InputFileError(f"{path.name}: {t.name!r} has per-sample shape "
                                 f"{list(a.shape[1:])}, the model wants {t.shape} (-1 = any)")
        arrays[t.name] = a.astype(np.dtype(t.dtype), copy=False)
    return arrays
