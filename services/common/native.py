"""Native helpers built at run time: a C source compiled once with the system C compiler,
cached under a folder by a digest of the source and flags, loaded with ctypes.

Building at run time keeps installation plain (no compiler needed to install offramp); each
user of a library says what it does without one (``tap_library``: ramps split stages;
``climb_native``: the tuner climbs in Python).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from services.common.config import load as load_config

COMPILERS = ("cc", "gcc", "clang")


def native_dir() -> Path:
    """Where built libraries are cached: ``$OFFRAMP_HOME/native``."""
    return load_config().home / "native"


def library_file(source: Path, folder: Path, flags: Sequence[str]) -> Path:
    """Where the library built from today's ``source`` with ``flags`` lives in ``folder``."""
    digest = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    return folder / f"{source.stem}-{digest}.so"


def build(source: Path, folder: Path, flags: Sequence[str]) -> Path:
    """Compile ``source`` into ``folder`` unless that build is there; raises with the
    compiler's message on failure. Safe against concurrent builders (atomic rename)."""
    out = library_file(source, folder, flags)
    if out.exists():
        return out
    cc = next((c for c in COMPILERS if shutil.which(c)), None)
    if cc is None:
        raise RuntimeError(f"no C compiler found (tried {', '.join(COMPILERS)})")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    cmd = [cc, *flags, "-o", str(tmp), str(source), "-lm"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-400:]}")
    os.replace(tmp, out)
    return out
