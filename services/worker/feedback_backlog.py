"""Feedback runs set aside so that a waiting request never queues behind one (latency mode).

Once every row of a batch has answered at a ramp, the rest of its run only computes what the
monitor needs: the final prediction and the later ramps' records. On a machine whose cores
the model fills, a request that arrives meanwhile waited for all of it: live on EfficientNet
(2-core VM, Poisson 44 req/s), answers at ramp 3 took 4.65 ms at the median but 7.29 ms at
the 75th percentile, near the 7.88 ms of requests that ran to the end.

So when a request is waiting, the worker stops such a run (ONNX Runtime's
``RunOptions.terminate``: the call ends before its next operator) and sets the batch aside
here; when the worker is idle it runs the batch again with its rows already marked as
answered (nothing answers twice) and publishes its telemetry then. A re-run is itself
stopped whenever a request arrives and goes back to the front. Feedback is late, never
lost: at most ``cap`` batches wait (beyond that, runs go to the end again) and a stopping
worker drains them. The cost is the part of a run redone (up to its last exit).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.messages import Batch, ExitConfig

DEFAULT_CAP = 8  # OFFRAMP_FEEDBACK_BACKLOG's default


@dataclass(frozen=True)
class SetAside:
    batch: Batch
    config: ExitConfig     # the config its answers were decided under
    received: float
    exit_at: np.ndarray    # the ramp each row answered at (every row did)


class FeedbackBacklog:
    """The set-aside batches and the run that may be stopped now (shared by the worker's
    event loop and its compute thread: deque appends and pops and attribute swaps are atomic
    under the GIL)."""

    def __init__(self, cap: int) -> None:
        if cap < 0:
            raise ValueError(f"feedback backlog cap must be >= 0, got {cap}")
        self.cap = cap
        self.items: deque[SetAside] = deque()
        self._tail: tuple[Any, bool] | None = None  # (RunOptions, is a re-run)
        self.cut = 0       # runs stopped for a waiting request
        self.rerun = 0     # set-aside batches whose feedback was published

    @property
    def enabled(self) -> bool:
        return self.cap > 0

    def __len__(self) -> int:
        return len(self.items)

    def only_feedback_left(self, run_options: Any, rerun: bool) -> None:
        """The run using ``run_options`` computes nothing anyone waits for from now on."""
        self._tail = (run_options, rerun)

    def run_over(self) -> None:
        self._tail = None

    def preempt(self) -> bool:
        """A request is waiting: stop the running call if it only computes feedback and
        there is room to set its batch aside (a re-run always goes back: it holds a place)."""
        tail = self._tail
        if tail is None:
            return False
        ro, rerun = tail
        if not rerun and len(self.items) >= self.cap:
            return False
        ro.terminate = True
        return True

    def set_aside(self, item: SetAside, rerun: bool) -> None:
        if rerun:
            self.items.appendleft(item)  # oldest feedback first
        else:
            self.items.append(item)
            self.cut += 1

    def take(self) -> SetAside:
        return self.items.popleft()
