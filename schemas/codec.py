"""msgpack codec: maps with a version field, numpy tensors as extension type 1.

A tensor travels as ``ExtType(1, msgpack([dtype, shape, data]))`` where ``dtype`` is a
numpy dtype string (``"<f4"``), ``shape`` a list of ints and ``data`` the raw C-order
bytes. No pickle, ever: decoding only builds numpy arrays of plain numeric dtypes.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache
from typing import Any

import msgpack
import numpy as np

TENSOR_EXT = 1
SCHEMA_VERSION = 1

# Plain numeric dtypes only: object/void dtypes would let a peer smuggle arbitrary data.
ALLOWED_KINDS = frozenset("biuf")


class CodecError(ValueError):
    """A message that is not valid msgpack or carries a malformed tensor."""


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        # A C-contiguous array is packed from its buffer (no tobytes copy); anything else
        # goes through tobytes(), which is C order whatever the layout. reshape(-1) keeps
        # 0-d arrays packable while the shape field preserves their 0-d shape.
        data = obj.reshape(-1).data if obj.flags.c_contiguous else obj.tobytes(order="C")
        payload = _packers.inner.pack([obj.dtype.str, list(obj.shape), data])
        return msgpack.ExtType(TENSOR_EXT, payload)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


@lru_cache(maxsize=64)
def _dtype(name: str) -> np.dtype:
    return np.dtype(name)


def decode_tensor(payload: bytes) -> np.ndarray:
    try:
        dtype_s, shape, data = msgpack.unpackb(payload, raw=False)
        dtype = _dtype(dtype_s)
    except Exception as exc:  # noqa: BLE001 - any failure here is a malformed tensor
        raise CodecError(f"malformed tensor: {exc}") from None
    if dtype.kind not in ALLOWED_KINDS:
        raise CodecError(f"tensor dtype {dtype_s!r} is not a plain numeric type")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CodecError(f"tensor shape must be a list of non-negative ints, got {shape!r}")
    count = math.prod(shape)
    if not isinstance(data, bytes) or len(data) != count * dtype.itemsize:
        size = len(data) if isinstance(data, bytes) else type(data).__name__
        raise CodecError(
            f"tensor data is {size} bytes but dtype {dtype_s} shape {shape} needs {count * dtype.itemsize}"
        )
    # frombuffer is zero-copy and read-only; callers that mutate must copy.
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == TENSOR_EXT:
        return decode_tensor(data)
    raise CodecError(f"unknown msgpack extension type {code}")


class _Packers(threading.local):
    # msgpack.packb builds a Packer per call, which costs more than packing a small
    # message; reusable packers are per thread because workers encode in threads.
    def __init__(self) -> None:
        self.outer = msgpack.Packer(default=_default, use_bin_type=True)
        self.inner = msgpack.Packer(use_bin_type=True)


_packers = _Packers()


def pack(obj: Any) -> bytes:
    return _packers.outer.pack(obj)


def unpack(data: bytes) -> Any:
    try:
        obj = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except CodecError:
        raise
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types for bad input
        raise CodecError(f"not valid msgpack: {exc.__class__.__name__}: {exc}") from None
    _refuse_timestamps(obj)
    return obj


def _refuse_timestamps(obj: Any) -> None:
    """msgpack decodes extension type -1 (timestamp) itself, without the ext hook; the
    contract refuses it like every extension type but 1."""
    if isinstance(obj, msgpack.Timestamp):
        raise CodecError("unknown msgpack extension type -1")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _refuse_timestamps(k)
            _refuse_timestamps(v)
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, dict | list | msgpack.Timestamp):
                _refuse_timestamps(v)
