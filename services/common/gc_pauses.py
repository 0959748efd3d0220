"""Keep Python's cyclic garbage collector from stalling a service while it serves.

A service imports numpy, ONNX Runtime, SQLAlchemy and often torch: hundreds of thousands of
long-lived objects. Every full (generation-2) collection walks them all, and the process
does nothing else meanwhile: 37-280 ms on a 2-core VM. Most fall while a service starts,
but a ``gc.callbacks`` probe of ``offramp demo`` caught one of 83 ms in a worker while it
served and one of 276 ms in the client while it timed requests (docs/benchmarks.md).
``settle`` collects once when a service has started and moves every object alive then into
the permanent generation (``gc.freeze``), so later collections walk only what the service
allocates while it serves. Reference counting still frees frozen objects; only an object
that joins cyclic garbage after the freeze stays (the collection just before it leaves
none that is garbage already).

A load generator also allocates as it times: in ``offramp bench superserve`` the client
still paused 5-23 ms every few seconds after the freeze (generations 1 and 2 walking what
the run had allocated), and whole bursts missed a 53 ms SLO behind them. ``timing`` keeps
the collector off while requests are timed: those collections found no garbage (reference
counting frees what a request leaves), so nothing piles up; one collection at the end walks
what the run allocated before the caller times anything else.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator


def _enabled(enabled: bool | None) -> bool:
    """``enabled`` None: as ``OFFRAMP_GC_FREEZE`` says (``Config.gc_freeze``; on unless 0)."""
    return os.environ.get("OFFRAMP_GC_FREEZE", "1") != "0" if enabled is None else enabled


_settled = False  # this process has frozen its heap; see settle_once


def settle(enabled: bool | None = None) -> bool:
    """Collect, then freeze every object now alive; returns whether it did (``enabled`` as
    in :func:`_enabled`)."""
    global _settled
    if not _enabled(enabled):
        return False
    gc.collect()
    gc.freeze()
    _settled = True
    return True


def settle_once(enabled: bool | None = None) -> bool:
    """:func:`settle` unless this process has frozen already (returns whether it froze now):
    a load generator drives several stacks in turn, and freezing again would pin whatever
    each one left alive for good. A flag says so, not ``gc.get_freeze_count()``: that walks
    the whole permanent generation, 70 ms for a bench client's, and it stalled the start of
    every timed run."""
    return False if _settled else settle(enabled)


@contextlib.contextmanager
def timing(enabled: bool | None = None) -> Iterator[None]:
    """While a load generator times requests: :func:`settle_once`, then no cyclic collection
    until the block ends (see module doc). Nested or already-disabled collectors are left as
    they are."""
    settle_once(enabled)
    if not (_enabled(enabled) and gc.isenabled()):
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        # now, not at the next allocations: those may be the next run's first requests
        gc.collect()
