"""The ramp tap's native library (``ramp_tap.c``), built and cached by
``services.common.native``. A machine without a C compiler serves tapped ramps split
instead, and ``load`` says why.
"""

from __future__ import annotations

import ctypes
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from services.common import native

SOURCE = Path(__file__).with_name("ramp_tap.c")
ABI = 1                  # offramp_tap_abi() of a library built from this SOURCE
FLAGS = ("-O2", "-shared", "-fPIC", "-fvisibility=default")

# (ramp, batch, n exited rows, rows int64*, logits float*, classes, outcome float* [batch, 2])
EXIT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_float),
                                 ctypes.c_int64, ctypes.POINTER(ctypes.c_float))


@dataclass(frozen=True)
class TapLibrary:
    path: str            # for SessionOptions.register_custom_ops_library
    lib: ctypes.CDLL     # offramp_tap_callback / offramp_tap_begin / offramp_tap_end


_lock = threading.Lock()
_loaded: TapLibrary | None = None
_failure: str | None = None


def library_file(folder: Path) -> Path:
    """Where the library built from today's SOURCE (and flags) lives in ``folder``."""
    return native.library_file(SOURCE, folder, FLAGS)


def build(folder: Path) -> Path:
    """Compile SOURCE into ``folder`` unless that build is there (``native.build``)."""
    return native.build(SOURCE, folder, FLAGS)


def load(folder: Path | None = None) -> TapLibrary | None:
    """The loaded library (built on first use), or None when it cannot be had here; the
    reason is then in ``failure()``. Cached per process."""
    global _loaded, _failure
    with _lock:
        if _loaded is None and _failure is None:
            try:
                path = build(folder if folder is not None else native.native_dir())
                lib = ctypes.CDLL(str(path))
                if lib.offramp_tap_abi() != ABI:
                    raise RuntimeError(f"{path} has ABI {lib.offramp_tap_abi()}, want {ABI}")
                lib.offramp_tap_callback.argtypes = [EXIT_CALLBACK]
                lib.offramp_tap_callback.restype = None
                # thresholds*, n, exit_at*, batch, score kind, report_all
                lib.offramp_tap_begin.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                                  ctypes.c_int64, ctypes.c_int32, ctypes.c_int32]
                lib.offramp_tap_begin.restype = None
                lib.offramp_tap_end.argtypes = []
                lib.offramp_tap_end.restype = None
                _loaded = TapLibrary(str(path), lib)
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                _failure = f"the ramp tap library could not be built or loaded: {exc}"
        return _loaded


def failure() -> str | None:
    """Why ``load`` returned None (None when it has not failed)."""
    return _failure
