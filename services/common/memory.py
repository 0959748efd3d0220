"""Keep large message buffers on the heap instead of a fresh mmap per message (glibc).

A request carrying an image (600 KB) or a batch of activations is copied a few times per
hop (socket read buffer, payload bytes, decoded tensor, re-encoded batch, outgoing frame).
glibc serves every allocation above its mmap threshold (128 KiB at start, raised only
when such a block is freed) with a new mapping, and trims freed heap top back to the
kernel, so each copy faulted its pages in again: in a one-off probe on EfficientNet the
router spent 4.9 ms of CPU per request, mostly page faults and page clearing (perf); with
the thresholds raised, 1.7-1.9 ms (``offramp bench overhead`` shows the end-to-end
effect). A process then keeps up to ``TRIM_THRESHOLD`` of freed heap for reuse.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1   # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024   # glibc's maximum; above NATS max_payload (8 MB)
TRIM_THRESHOLD = 64 * 1024 * 1024


def keep_large_buffers() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True when applied.

    A no-op (False) on other C libraries, and when the user set glibc's own
    ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` (theirs win)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
