"""Mutated inference requests for the chaos bench's fuzz scenario: bit flips,
truncations, garbage, fields of the wrong type, unknown keys, huge ids, foreign and
malformed msgpack extension types, nil fields, wrong shapes and dtypes, bad SLOs and
deep nesting. Every body goes to ``offramp.infer.<model>`` with a reply subject, and the
contract says each gets exactly one reply (an error or, for the harmless ones, ok).

Deterministic from the seed, so a finding can be replayed."""

from __future__ import annotations

import math
from collections.abc import Callable

import msgpack
import numpy as np

from schemas.codec import TENSOR_EXT, pack

Rng = np.random.Generator
Base = dict  # a valid request map: v, id, model, inputs, slo_ms

ODD_VALUES: list = [None, True, False, 0, -1, 2**64 - 1, -(2**63), 1.5, math.nan, math.inf,
                    -math.inf, "", "x", "\u00e9\u4e2d\U0001f600", b"", b"\x00\xff", [], {},
                    [1, "a", None], {"k": [1, 2]}, {7: "int key"},
                    msgpack.ExtType(TENSOR_EXT, b"\xc1"), msgpack.Timestamp(0, 0)]
FIELDS = ("v", "id", "model", "inputs", "slo_ms")


def _raw(m: dict) -> bytes:
    """A map packed as is (ExtType values stay ExtType; tensors become ext 1)."""
    return pack(m)


def _tensor_ext(dtype: str, shape: object, data: object) -> msgpack.ExtType:
    return msgpack.ExtType(TENSOR_EXT, msgpack.packb([dtype, shape, data], use_bin_type=True))


def bitflip(base: Base, rng: Rng) -> bytes:
    body = bytearray(_raw(base))
    for _ in range(int(rng.integers(1, 9))):
        pos = int(rng.integers(0, len(body) * 8))
        body[pos // 8] ^= 1 << (pos % 8)
    return bytes(body)


def truncate(base: Base, rng: Rng) -> bytes:
    body = _raw(base)
    return body[:int(rng.integers(0, len(body)))]


def garbage(base: Base, rng: Rng) -> bytes:
    return rng.bytes(int(rng.integers(0, 512)))


def wrong_type(base: Base, rng: Rng) -> bytes:
    m = dict(base)
    m[FIELDS[int(rng.integers(0, len(FIELDS)))]] = ODD_VALUES[int(rng.integers(0, len(ODD_VALUES)))]
    return _raw(m)


def unknown_keys(base: Base, rng: Rng) -> bytes:
    m = dict(base)
    for k in range(int(rng.integers(1, 6))):
        key = [f"extra{k}", int(rng.integers(0, 1000)), "", "\u00fc" * 3][k % 4]
        m[key] = ODD_VALUES[int(rng.integers(0, len(ODD_VALUES)))]
    return _raw(m)


def huge_id(base: Base, rng: Rng) -> bytes:
    size = [257, 1024, 65_536, 262_144][int(rng.integers(0, 4))]
    return _raw({**base, "id": base["id"] + "-" + "h" * size})


def reserved_ext(base: Base, rng: Rng) -> bytes:
    """The input tensor sent under an ext type msgpack reserves (negative codes, which
    ``msgpack.ExtType`` refuses to build): its type byte is patched in the packed body."""
    name = next(iter(base["inputs"]))
    ext = msgpack.ExtType(TENSOR_EXT, msgpack.packb(
        [base["inputs"][name].dtype.str, list(base["inputs"][name].shape),
         base["inputs"][name].tobytes()], use_bin_type=True))
    body = _raw({**base, "inputs": {name: ext}})
    packed = msgpack.packb(ext)
    code = int(rng.choice([-128, -2, -1]))
    patched = packed[:len(packed) - len(ext.data) - 1] + (code & 0xFF).to_bytes(1, "little") + ext.data
    return body.replace(packed, patched, 1)


def ext_types(base: Base, rng: Rng) -> bytes:
    name = next(iter(base["inputs"]))
    arr = base["inputs"][name]
    choices = [
        msgpack.ExtType(int(rng.choice([0, 2, 5, 127])), arr.tobytes()),
        msgpack.Timestamp(1, 2),
        msgpack.ExtType(TENSOR_EXT, b""),
        msgpack.ExtType(TENSOR_EXT, rng.bytes(16)),
        _tensor_ext("O", list(arr.shape), arr.tobytes()),
        _tensor_ext("<c8", list(arr.shape), arr.tobytes()),
        _tensor_ext("V4", list(arr.shape), arr.tobytes()),
        _tensor_ext("<M8[s]", list(arr.shape), arr.tobytes()),
        _tensor_ext("not a dtype", list(arr.shape), arr.tobytes()),
        _tensor_ext(arr.dtype.str, [-1], arr.tobytes()),
        _tensor_ext(arr.dtype.str, [2**40], arr.tobytes()),
        _tensor_ext(arr.dtype.str, "16", arr.tobytes()),
        _tensor_ext(arr.dtype.str, list(arr.shape), arr.tobytes()[:-1]),
        _tensor_ext(arr.dtype.str, list(arr.shape), "a string, not bin"),
        _tensor_ext(arr.dtype.str, list(arr.shape), [1, 2, 3]),
        msgpack.ExtType(TENSOR_EXT, msgpack.packb([msgpack.ExtType(TENSOR_EXT, b"")])),
    ]
    m = dict(base)
    where = int(rng.integers(0, 3))
    value = choices[int(rng.integers(0, len(choices)))]
    if where == 0:
        m["inputs"] = {name: value}
    elif where == 1:
        m["id"] = value
    else:
        m["slo_ms"] = value
    return _raw(m)


def nil_field(base: Base, rng: Rng) -> bytes:
    return _raw({**base, FIELDS[int(rng.integers(0, len(FIELDS)))]: None})


def bad_inputs(base: Base, rng: Rng) -> bytes:
    name = next(iter(base["inputs"]))
    arr = base["inputs"][name]
    choices = [{name: arr[None]}, {name: arr.astype(np.float64)}, {name: arr.reshape(-1)[:-1]},
               {name: arr, "extra": arr}, {"not-" + name: arr}, {},
               {name: np.zeros((), arr.dtype)}, {name: arr.astype(np.int64)},
               {name: np.zeros((0,), arr.dtype)}, {name: arr.astype(bool)},
               {name: np.full(arr.shape, np.nan, arr.dtype) if arr.dtype.kind == "f" else arr}]
    return _raw({**base, "inputs": choices[int(rng.integers(0, len(choices)))]})


def bad_slo(base: Base, rng: Rng) -> bytes:
    values = [0, -5, 0.0, -0.0, math.nan, math.inf, -math.inf, True, "100", 1e308, 2**64 - 1,
              1e-300, [100]]
    return _raw({**base, "slo_ms": values[int(rng.integers(0, len(values)))]})


def not_a_map(base: Base, rng: Rng) -> bytes:
    values = [[1, 2, 3], "offramp", 42, None, 1.5, b"bytes", [base["id"]], True]
    return msgpack.packb(values[int(rng.integers(0, len(values)))], use_bin_type=True)


def deep_nesting(base: Base, rng: Rng) -> bytes:
    depth = [64, 512, 5000][int(rng.integers(0, 3))]
    head = b"\x91" * depth  # fixarray of one element, nested
    field = ["extra", "id", "inputs"][int(rng.integers(0, 3))]
    body = _raw({k: v for k, v in base.items() if k != field})
    # the map gains one key whose value is `depth` arrays deep around a nil
    count = body[0] & 0x0F
    return bytes([0x80 | (count + 1)]) + body[1:] + msgpack.packb(field) + head + b"\xc0"


MUTATIONS: dict[str, Callable[[Base, Rng], bytes]] = {
    "bitflip": bitflip, "truncate": truncate, "garbage": garbage, "wrong_type": wrong_type,
    "unknown_keys": unknown_keys, "huge_id": huge_id, "ext_types": ext_types,
    "reserved_ext": reserved_ext,
    "nil_field": nil_field, "bad_inputs": bad_inputs, "bad_slo": bad_slo,
    "not_a_map": not_a_map, "deep_nesting": deep_nesting,
}


def mutated(model: str, inputs: list[dict[str, np.ndarray]], n: int, tag: str,
            seed: int = 0) -> list[tuple[str, str, bytes]]:
    """``n`` (kind, id it started from, body), the kinds taken in turn."""
    rng = np.random.default_rng(seed)
    kinds = list(MUTATIONS)
    out = []
    for i in range(n):
        rid = f"{tag}-{i}"
        base = {"v": 1, "id": rid, "model": model, "inputs": inputs[i % len(inputs)],
                "slo_ms": 2000.0}
        kind = kinds[i % len(kinds)]
        out.append((kind, rid, MUTATIONS[kind](base, rng)))
    return out
