"""Checked field access for message decoders.

A decoder reads each field through :class:`FieldReader`, so every malformed message is
refused the same way: a :class:`ServingError` (``bad_request``) that names the message
and the field, and says what was expected and what came instead.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from schemas import errors
from schemas.errors import ServingError

REQUIRED: Any = object()  # default of a field that must be present (and not nil)

# dtype kinds a tensor field may hold, as named in error messages
INTS = "iu"
FLOATS = "f"
_KIND_NAMES = {INTS: "integers", FLOATS: "floats"}


def is_int(value: Any) -> bool:
    if type(value) is int:  # what msgpack gives: skip the slow ABC check
        return True
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def _is_number(value: Any) -> bool:
    if type(value) is float or type(value) is int:  # what msgpack gives
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


class FieldReader:
    """The fields of one decoded map, read with their type checked.

    ``default``: the value of an absent or nil field; without one the field is required.
    """

    def __init__(self, msg: Any, what: str) -> None:
        self.what = what
        if not isinstance(msg, dict):
            raise self.error(f"expected a map, got {type(msg).__name__}")
        self.msg = msg

    def error(self, message: str) -> ServingError:
        return ServingError(errors.BAD_REQUEST, f"malformed {self.what}: {message}")

    def _value(self, name: str, default: Any) -> Any:
        value = self.msg.get(name)
        if value is None and default is REQUIRED:
            raise self.error(f"field {name!r} is missing")
        return value

    def _wrong(self, name: str, expected: str, value: Any) -> ServingError:
        return self.error(f"field {name!r} must be {expected}, got {value!r:.80}")

    def _typed(self, name: str, default: Any, ok: Callable[[Any], bool], expected: str,
               convert: Callable[[Any], Any]) -> Any:
        value = self._value(name, default)
        if value is None:
            return default
        if not ok(value):
            raise self._wrong(name, expected, value)
        return convert(value)

    def text(self, name: str, default: Any = REQUIRED) -> str:
        return self._typed(name, default, lambda v: isinstance(v, str), "a string", str)

    def integer(self, name: str, default: Any = REQUIRED) -> int:
        return self._typed(name, default, is_int, "an integer", int)

    def number(self, name: str, default: Any = REQUIRED) -> float:
        return self._typed(name, default, _is_number, "a number", float)

    def flag(self, name: str, default: Any = REQUIRED) -> bool:
        return self._typed(name, default, lambda v: isinstance(v, bool | np.bool_), "a bool",
                           bool)

    def _array(self, name: str) -> list:
        value = self._value(name, REQUIRED)
        if not isinstance(value, list | tuple):
            raise self._wrong(name, "an array", value)
        return list(value)

    def texts(self, name: str) -> list[str]:
        value = self._array(name)
        if not all(isinstance(v, str) for v in value):
            raise self._wrong(name, "an array of strings", value)
        return value

    def integers(self, name: str) -> list[int]:
        value = self._array(name)
        if not all(is_int(v) for v in value):
            raise self._wrong(name, "an array of integers", value)
        return [int(v) for v in value]

    def numbers(self, name: str) -> list[float]:
        value = self._array(name)
        if not all(_is_number(v) for v in value):
            raise self._wrong(name, "an array of numbers", value)
        return [float(v) for v in value]

    def number_rows(self, name: str) -> list[list[float]]:
        value = self._array(name)
        if not all(isinstance(row, list | tuple) and all(_is_number(v) for v in row)
                   for row in value):
            raise self._wrong(name, "an array of arrays of numbers", value)
        return [[float(v) for v in row] for row in value]

    def maps(self, name: str) -> list[dict]:
        value = self._array(name)
        if not all(isinstance(v, dict) for v in value):
            raise self._wrong(name, "an array of maps", value)
        return value

    def int_key_numbers(self, name: str) -> dict[int, float]:
        value = self._value(name, REQUIRED)
        if not isinstance(value, dict) or not all(
                is_int(k) and _is_number(v) for k, v in value.items()):
            raise self._wrong(name, "a map of integer keys to numbers", value)
        return {int(k): float(v) for k, v in value.items()}

    def tensor(self, name: str, kinds: str, shape: tuple[int, ...]) -> np.ndarray:
        """A tensor of one of the dtype ``kinds`` with exactly ``shape``."""
        value = self._value(name, REQUIRED)
        if not isinstance(value, np.ndarray):
            raise self._wrong(name, "a tensor (msgpack ext type 1)", value)
        if value.dtype.kind not in kinds:
            raise self.error(f"field {name!r} must hold {_KIND_NAMES.get(kinds, kinds)}, "
                             f"got dtype {value.dtype.str!r}")
        if value.shape != shape:
            raise self.error(f"field {name!r} must have shape {list(shape)}, "
                             f"got {list(value.shape)}")
        return value

    def tensors(self, name: str, kinds: str) -> list[np.ndarray]:
        """An array of tensors of one of the dtype ``kinds`` (shapes checked by the caller)."""
        value = self._array(name)
        for k, t in enumerate(value):
            if not isinstance(t, np.ndarray):
                raise self._wrong(f"{name}[{k}]", "a tensor (msgpack ext type 1)", t)
            if t.dtype.kind not in kinds:
                raise self.error(f"field {name}[{k}] must hold {_KIND_NAMES.get(kinds, kinds)}, "
                                 f"got dtype {t.dtype.str!r}")
        return value

    def value_shape(self, name: str, axis: int) -> int:
        """Axis ``axis`` of the tensor in ``name`` (for shapes that only the data fixes),
        0 when it is not a tensor of that rank (the shape check then says what is wrong)."""
        value = self._value(name, REQUIRED)
        if isinstance(value, np.ndarray) and value.ndim > axis:
            return int(value.shape[axis])
        return 0
