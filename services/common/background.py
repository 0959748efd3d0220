"""Background work at low CPU priority, so it does not slow the requests being served.

A worker builds the sessions a new exit config needs while it serves: about 0.4 s of CPU
for MiniLM, on the cores the running batches use (on 2 cores, batches that overlapped a
build took twice their time at the median). Linux keeps a nice value per thread, so
``run_low`` raises the calling thread's for the duration of the work. Threads started
meanwhile (ONNX Runtime creates a session's intra-op pool when the session is made) would
inherit it and then serve at low priority, so they are set back afterwards; where the
process may not lower a nice value again (no CAP_SYS_NICE), the work runs as is.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
LOW = 19  # the lowest priority: the scheduler still runs it whenever a core is idle
_TASKS = "/proc/self/task"


def _threads() -> set[int]:
    return {int(t) for t in os.listdir(_TASKS)}


@functools.lru_cache(maxsize=1)
def supported() -> bool:
    """Whether this process can lower a thread's priority and raise it back (Linux, with
    the privilege to lower a nice value); checked once, on a scratch thread."""
    if not hasattr(os, "setpriority") or not os.path.isdir(_TASKS):
        return False
    ok: list[bool] = []

    def probe() -> None:
        me = threading.get_native_id()
        try:
            base = os.getpriority(os.PRIO_PROCESS, me)
            os.setpriority(os.PRIO_PROCESS, me, min(base + 1, LOW))
            os.setpriority(os.PRIO_PROCESS, me, base)
            ok.append(os.getpriority(os.PRIO_PROCESS, me) == base)
        except OSError:
            ok.append(False)

    t = threading.Thread(target=probe, name="offramp-priority-probe")
    t.start()
    t.join()
    return bool(ok and ok[0])


def run_low(fn: Callable[..., T], *args) -> T:
    """``fn(*args)`` with the calling thread at low priority; threads it starts end at the
    caller's usual priority."""
    if not supported():
        return fn(*args)
    me = threading.get_native_id()
    base = os.getpriority(os.PRIO_PROCESS, me)
    before = _threads()
    os.setpriority(os.PRIO_PROCESS, me, LOW)
    try:
        return fn(*args)
    finally:
        os.setpriority(os.PRIO_PROCESS, me, base)
        for tid in _threads() - before:
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) != base:
                    os.setpriority(os.PRIO_PROCESS, tid, base)
            except (ProcessLookupError, PermissionError):
                pass  # already gone, or not ours to change
