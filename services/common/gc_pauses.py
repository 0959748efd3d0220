"""Keep Python's cyclic garbage collector from stalling a service while it serves.

A service imports numpy, ONNX Runtime, SQLAlchemy and often torch: hundreds of thousands of
long-lived objects. Every full (generation-2) collection walks them all, and the process
does nothing else meanwhile. A ``gc.callbacks`` probe of ``offramp bench overhead`` on a
2-core VM measured full collections of 80-135 ms in workers, the profiler and the monitor,
and up to 258 ms in the bench client: a stall for every request in flight, far above the
model's own time. ``settle`` collects once when a service has started and moves every
object alive then into the permanent generation (``gc.freeze``), so later collections walk
only what the service allocates while it serves. Reference counting still frees frozen
objects; only cyclic garbage still alive at the freeze would be kept, and the collection
just before it leaves none.
"""

from __future__ import annotations

import gc
import os


def settle(enabled: bool | None = None) -> int:
    """Collect, then freeze every object now alive; returns how many objects the permanent
    generation holds (0 when disabled). ``enabled`` None: as ``OFFRAMP_GC_FREEZE`` says
    (``Config.gc_freeze``; on unless 0)."""
    if enabled is None:
        enabled = os.environ.get("OFFRAMP_GC_FREEZE", "1") != "0"
    if not enabled:
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
