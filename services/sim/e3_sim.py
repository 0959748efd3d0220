"""Discrete-event simulation of compute-mode serving on many devices (E3 §3.3, §5), pure.

One engine serves all three policies of ``offramp bench e3 --sim``: a policy is a
:class:`Pipeline`, a chain of stages, each a contiguous range of blocks with some active
ramps, on ``replicas`` devices of one class (a :class:`LatencyTable`).

- vanilla: one stage, the whole model, no ramp; naive early exit: one stage with ramps;
  E3: the optimizer's stages (``services.optimizer.splits.plan``).
- Stage 0 takes its batches from one shared queue (arrival order; every request has the
  same SLO, so this is also earliest-deadline-first): whenever a device of the stage is
  idle it takes up to ``batch`` requests at once (dynamic batching, no waiting to fill).
- A batch runs block by block. Block ``k`` costs the table's time at the number of rows
  still in the batch; an active ramp's head costs its time at that number too, and the
  rows whose exit is that ramp are answered right then and leave the batch (compute
  mode). When every row has left, the rest of the stage is skipped. The device is busy
  until the batch ends.
- The rows left at the end of a stage that is not the last are one message to the next
  stage: ``fixed_ms + rows * ms_per_row``, sent once the batch ends, over one link per cut
  (transfers on a link are serialised, as in the planner). With ``per_device_links`` each
  device has its own link instead (a NIC per server): a message occupies the sending
  stage's and the receiving stage's earliest-free device links for its duration, so a
  cut carries up to ``min(replicas before, replicas after)`` messages at once. The next stage holds the parts
  in a :class:`~services.worker.fusion.FusionBuffer` (the live workers' code) and fuses
  them up to its target batch, earliest deadline first, cutting the part that would pass
  it (its rest waits for the next batch); a partial batch leaves when the
  earliest deadline leaves only the rest of the pipeline's service time, or after the
  hold limit.
- Flow control between stages (credit, as the router gives first-stage workers): a stage
  starts a batch only while the rows held for, or travelling to, the next stage are fewer
  than that stage's credit: ``CREDIT_BATCHES`` of its target batches per replica, plus one
  batch per replica of the stage before (what its batches in flight may still send, so a
  wide stage feeding a narrow one is not throttled to a few batches at a time). A stage
  that cannot keep up so holds back the stages before it, and the backlog stays in the
  first queue, where nothing is known of a request's hardness yet: an overloaded pipeline
  cannot answer the easy requests that exit early and drop the hard ones that go on.
- Dropping, the same rule for every policy: when a request is about to enter a stage
  (taken from the queue or from a fusion buffer) and ``now + remaining`` is past its
  deadline, where ``remaining`` is the policy's worst case from that stage to the end
  (:meth:`Pipeline.remaining_ms`: every block and active ramp head at the full batch,
  nobody exiting, full transfers, and the fusion hold limit at every later stage), it is
  dropped: it might not be answered in time, and nobody knows yet whether it will exit
  early. A dropped request is never answered; an answer after the deadline is counted as
  late. Under overload the queue then waits at the edge of what the worst case allows,
  instead of turning every answer late (with an expected time instead, every request
  slower than expected would be).

Which ramp a request exits at is an input (``exit_site``, site index or ``FINAL``): the
caller decides it from a trace (the first active ramp whose score passes its threshold).
Deterministic: no randomness and no clock; ties between events go by the order they were
scheduled. Times are seconds, names ending in ``_ms`` milliseconds.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from services.optimizer.block_costs import LatencyTable
from services.worker.fusion import FusionBuffer, Part

FINAL = -1  # exit of a request the final layer answers
NOT_DROPPED = -1
CREDIT_BATCHES = 2  # a stage's credit: its target batches per replica held or travelling to it


@dataclass(frozen=True)
class StageSpec:
    """Blocks ``first_block..last_block`` with the ramps at ``sites`` running (ascending
    chain site indices inside the stage), on ``replicas`` devices timed by ``table``.
    ``expected_ms``: what one batch of ``batch`` rows is expected to take as samples exit
    (capacity estimates); deadlines use :attr:`worst_ms`;
    ``transfer_*``: the message to the next stage (ignored for the last stage);
    ``per_device_links``: each replica sends and receives on its own link."""

    first_block: int
    last_block: int
    sites: tuple[int, ...]
    replicas: int
    batch: int
    table: LatencyTable
    expected_ms: float
    device_class: str = ""
    cost_per_s: float = 1.0
    transfer_fixed_ms: float = 0.0
    transfer_ms_per_row: float = 0.0
    per_device_links: bool = False

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.batch < 1 or self.first_block > self.last_block:
            raise ValueError("a stage needs replicas >= 1, batch >= 1 and first <= last block")

    @property
    def worst_ms(self) -> float:
        """A full batch through every block and active head, nobody exiting."""
        blocks = self.table.blocks_at(self.batch)[self.first_block:self.last_block + 1]
        heads = self.table.heads_at(self.batch)[list(self.sites)]
        return float(blocks.sum() + heads.sum())


@dataclass(frozen=True)
class Pipeline:
    """A policy: its stages in model order and where the model's ramp sites sit
    (``ramp_after[s]``: the block site ``s`` follows, as in ``ModelChain``)."""

    name: str
    stages: tuple[StageSpec, ...]
    ramp_after: tuple[int, ...]
    hold_ms: float = 0.0  # longest a part waits for company in a fusion buffer

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a pipeline needs at least one stage")
        for a, b in zip(self.stages, self.stages[1:], strict=False):
            if b.first_block != a.last_block + 1:
                raise ValueError("stages must cover consecutive block ranges")
        for s in self.stages:
            if any(not s.first_block <= self.ramp_after[x] <= s.last_block for x in s.sites):
                raise ValueError(f"stage {s.first_block}..{s.last_block}: a ramp outside it")

    @property
    def active(self) -> tuple[int, ...]:
        """Every ramp site that runs somewhere: exits are decided over these."""
        return tuple(x for s in self.stages for x in s.sites)

    @property
    def devices(self) -> int:
        return sum(s.replicas for s in self.stages)

    @property
    def cost_per_s(self) -> float:
        return sum(s.replicas * s.cost_per_s for s in self.stages)

    def remaining_ms(self, stage: int) -> float:
        """Worst-case time from entering ``stage`` to the end: full batches through every
        block and active head, full transfers, and the hold limit at every later stage
        (the longest a part waits for company there)."""
        rest = self.stages[stage:]
        return (sum(s.worst_ms for s in rest) + sum(transfer_ms(s, s.batch) for s in rest[:-1])
                + self.hold_ms * (len(rest) - 1))


def transfer_ms(stage: StageSpec, rows: int) -> float:
    return stage.transfer_fixed_ms + rows * stage.transfer_ms_per_row


@dataclass
class SimResult:
    """Per request: when it was answered (NaN: dropped) and the stage where it was dropped
    (``NOT_DROPPED`` otherwise); per stage: the rows of every batch it ran, busy device-ms;
    per block: rows it processed in all and how many batches ran it."""

    done_s: np.ndarray
    dropped_at: np.ndarray
    batch_rows: list[list[int]]
    busy_ms: list[float]
    block_rows: np.ndarray
    block_runs: np.ndarray

    @property
    def answered(self) -> np.ndarray:
        return ~np.isnan(self.done_s)

    def mean_batch_at_blocks(self) -> np.ndarray:
        """Mean rows of a batch at each block (0 where no batch ran the block)."""
        return np.divide(self.block_rows, self.block_runs,
                         out=np.zeros(self.block_rows.shape), where=self.block_runs > 0)


class BatchTimer:
    """Block and head times of one stage at every whole batch size up to ``rows`` (a
    stage's batch only shrinks), looked up instead of interpolated per block."""

    def __init__(self, stage: StageSpec, ramp_after: tuple[int, ...], rows: int,
                 n_sites: int) -> None:
        sizes = np.arange(rows + 1, dtype=np.float64)
        blocks = stage.table.blocks_at(sizes)  # (n_blocks, rows + 1)
        heads = stage.table.heads_at(sizes)
        self.stage = stage
        n = len(stage.sites)
        # the stage's steps: (block's times, the ramp's position in the stage or None,
        # that ramp head's times); plain lists, read once per block of every batch
        after = {ramp_after[s]: j for j, s in enumerate(stage.sites)}
        self.steps = [(blocks[k].tolist(), after.get(k),
                       heads[stage.sites[after[k]]].tolist() if k in after else None)
                      for k in range(stage.first_block, stage.last_block + 1)]
        # position of each exit in the stage (n: not here, the row goes on); FINAL is -1
        self.n_here = n
        self.position = [n] * (n_sites + 1)
        for j, x in enumerate(stage.sites):
            self.position[x] = j
        self.rows_at = [0] * blocks.shape[0]  # per block of the model: rows run in all
        self.runs_at = [0] * blocks.shape[0]  # ... and batches

    def run(self, exits: list[int]) -> tuple[list[float | None], float]:
        """One batch whose rows exit at ``exits`` (site or FINAL): per row, ms from the
        start to its answer (None for the rows that leave the stage alive), and the
        batch's ms. Plain Python: batches are small and many."""
        pos = [self.position[e] for e in exits]  # FINAL (-1) reads the last entry: n
        counts = [0] * (self.n_here + 1)
        for p in pos:
            counts[p] += 1
        at: list[float | None] = [None] * (self.n_here + 1)
        left, t = len(exits), 0.0
        k = self.stage.first_block
        for blk, j, head in self.steps:
            t += blk[left]
            self.rows_at[k] += left
            self.runs_at[k] += 1
            k += 1
            if j is None:
                continue
            t += head[left]
            at[j] = t
            left -= counts[j]
            if left == 0:
                break
        return [at[p] for p in pos], t


@dataclass
class _StageState:
    idle: int
    buffer: FusionBuffer | None
    timer: BatchTimer
    wake_at: float = math.inf
    link_free: float = 0.0
    send_free: list[float] = field(default_factory=list)  # per-device links (out)
    recv_free: list[float] = field(default_factory=list)  # per-device links (in)
    pending: int = 0  # rows held in the buffer or travelling to it
    credit: int = 0
    rows: list[int] = field(default_factory=list)
    busy_ms: float = 0.0


class Simulation:
    """One run of a pipeline over a request stream (see the module docstring). Requests
    are plain indices into per-request lists: batches are small and many."""

    def __init__(self, pipe: Pipeline, arrival_s: np.ndarray, exit_site: np.ndarray,
                 slo_ms: float) -> None:
        arrival = np.asarray(arrival_s, dtype=np.float64)
        exits = np.asarray(exit_site, dtype=np.int64)
        if arrival.shape != exits.shape or arrival.ndim != 1:
            raise ValueError("one arrival time and one exit per request")
        if arrival.size and np.any(np.diff(arrival) < 0):
            raise ValueError("arrival times must be sorted")
        bad = set(np.unique(exits).tolist()) - {FINAL, *pipe.active}
        if bad:
            raise ValueError(f"exits at ramps the pipeline does not run: {sorted(bad)}")
        self.pipe = pipe
        self.arrival: list[float] = arrival.tolist()
        self.exit: list[int] = exits.tolist()
        self.deadline: list[float] = (arrival + slo_ms / 1e3).tolist()
        self.done: list[float] = [math.nan] * arrival.size
        self.dropped: list[int] = [NOT_DROPPED] * arrival.size
        self.queue: deque[int] = deque()
        self.events: list[tuple[float, int, str, int, object]] = []
        self.seq = 0
        self.remaining = [pipe.remaining_ms(i) / 1e3 for i in range(len(pipe.stages))]
        self.state = [self._state(i, s) for i, s in enumerate(pipe.stages)]

    def _state(self, i: int, s: StageSpec) -> _StageState:
        buf = None if i == 0 else FusionBuffer(s.batch, self.remaining[i] * 1e3,
                                              self.pipe.hold_ms, split=_split_rows)
        rows = max(p.batch for p in self.pipe.stages[:i + 1])
        timer = BatchTimer(s, self.pipe.ramp_after, rows, len(self.pipe.ramp_after))
        before = self.pipe.stages[i - 1] if i else None
        upstream = before.replicas * before.batch if before else 0
        return _StageState(s.replicas, buf, timer,
                           credit=CREDIT_BATCHES * s.replicas * s.batch + upstream,
                           send_free=[0.0] * s.replicas, recv_free=[0.0] * s.replicas)

    def _push(self, t: float, kind: str, stage: int, payload: object = None) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, stage, payload))
        self.seq += 1

    def run(self) -> SimResult:
        n, i = len(self.arrival), 0
        while i < n or self.events:
            if i < n and (not self.events or self.arrival[i] < self.events[0][0]):
                self.queue.append(i)
                now, i = self.arrival[i], i + 1
                self._dispatch(0, now)
                continue
            now, _, kind, stage, payload = heapq.heappop(self.events)
            st = self.state[stage]
            if kind == "done":
                st.idle += 1
            elif kind == "part":
                st.buffer.add(payload)
            elif kind == "wake" and st.wake_at == payload:
                st.wake_at = math.inf
            self._dispatch(stage, now)
        if self.queue or any(s.pending for s in self.state):
            raise RuntimeError("simulation stalled with requests held")  # a bug, not a result
        return SimResult(np.array(self.done), np.array(self.dropped, dtype=np.int64),
                         [s.rows for s in self.state], [s.busy_ms for s in self.state],
                         np.sum([s.timer.rows_at for s in self.state], axis=0),
                         np.sum([s.timer.runs_at for s in self.state], axis=0))

    def _take(self, stage: int, now: float) -> list[int] | None:
        """The rows of the next batch of ``stage`` (None: nothing to run now), dropping
        those that could no longer make their deadline."""
        limit = now + self.remaining[stage]
        deadline, dropped = self.deadline, self.dropped
        rows: list[int] = []
        if stage == 0:
            q, target = self.queue, self.pipe.stages[0].batch
            while q and len(rows) < target:
                r = q.popleft()
                if deadline[r] < limit:
                    dropped[r] = 0
                else:
                    rows.append(r)
            return rows or None
        st = self.state[stage]
        while not rows:
            parts = st.buffer.take(now)
            if not parts:
                return None
            for p in parts:
                st.pending -= p.rows
                for r in p.payload:
                    if deadline[r] < limit:
                        dropped[r] = stage
                    else:
                        rows.append(r)
        return rows

    def _blocked(self, stage: int) -> bool:
        """No credit: the next stage already holds or awaits its share of rows."""
        nxt = stage + 1
        return nxt < len(self.state) and self.state[nxt].pending >= self.state[nxt].credit

    def _dispatch(self, stage: int, now: float) -> None:
        st = self.state[stage]
        held = st.pending
        while st.idle > 0 and not self._blocked(stage):
            rows = self._take(stage, now)
            if rows is None:
                break
            st.idle -= 1
            self._run_batch(stage, now, rows)
        if st.pending < held:  # rows left the buffer (run or dropped): credit for the stage before
            self._dispatch(stage - 1, now)
        if st.buffer is not None and st.idle > 0 and not self._blocked(stage):
            due = st.buffer.flush_at()  # (a blocked stage is woken when credit comes back)
            if due is not None and not st.wake_at <= due:
                st.wake_at = max(due, now)
                self._push(st.wake_at, "wake", stage, st.wake_at)

    def _run_batch(self, stage: int, now: float, rows: list[int]) -> None:
        st = self.state[stage]
        offsets, ms = st.timer.run([self.exit[r] for r in rows])
        st.rows.append(len(rows))
        st.busy_ms += ms
        end = now + ms / 1e3
        self._push(end, "done", stage)
        last = stage == len(self.pipe.stages) - 1
        survivors = []
        for r, off in zip(rows, offsets, strict=True):
            if off is not None:
                self.done[r] = now + off / 1e3
            elif last:
                self.done[r] = end
            else:
                survivors.append(r)
        if not survivors:
            return
        nxt = self.state[stage + 1]
        nxt.pending += len(survivors)
        arrive = self._send(stage, end, len(survivors))
        part = Part(len(survivors), min(self.deadline[r] for r in survivors), arrive, survivors)
        self._push(arrive, "part", stage + 1, part)

    def _send(self, stage: int, ready: float, rows: int) -> float:
        """When a message of ``rows`` sent from ``stage`` at ``ready`` has arrived."""
        spec, st, nxt = self.pipe.stages[stage], self.state[stage], self.state[stage + 1]
        took = transfer_ms(spec, rows) / 1e3
        if not spec.per_device_links:
            st.link_free = max(ready, st.link_free) + took
            return st.link_free
        i = min(range(len(st.send_free)), key=st.send_free.__getitem__)
        j = min(range(len(nxt.recv_free)), key=nxt.recv_free.__getitem__)
        arrive = max(ready, st.send_free[i], nxt.recv_free[j]) + took
        st.send_free[i] = nxt.recv_free[j] = arrive
        return arrive


def _split_rows(rows: list[int], k: int) -> tuple[list[int], list[int]]:
    return rows[:k], rows[k:]


def simulate(pipe: Pipeline, arrival_s: np.ndarray, exit_site: np.ndarray,
             slo_ms: float) -> SimResult:
    """Serve every request of the stream with ``pipe``: each is answered exactly once or
    dropped (see the module docstring)."""
    return Simulation(pipe, arrival_s, exit_site, slo_ms).run()


def exit_sites(score: np.ndarray, thresholds: np.ndarray, active: tuple[int, ...]) -> np.ndarray:
    """Per request (columns of ``score``, sites x requests, lower = more confident): the
    first active site whose score is below its threshold, else ``FINAL`` (a threshold of 0
    never exits, as everywhere in the project)."""
    n = score.shape[1]
    out = np.full(n, FINAL, dtype=np.int64)
    for s in sorted(active, reverse=True):  # the earliest passing site written last wins
        out[score[s] < thresholds[s]] = s
    return out


@dataclass(frozen=True)
class Summary:
    """What the bench reports of one policy's run (see :func:`summarize`)."""

    goodput_rps: float
    p50_ms: float
    p99_ms: float
    agreement: float
    cost: float  # device-seconds (x cost per device-second) per 1,000 answers within the SLO
    answered: int
    late: int
    dropped: int
    dropped_by_stage: tuple[int, ...]
    mean_batch: tuple[float, ...]
    utilisation: tuple[float, ...]
    devices: int
    window_s: float

    def to_dict(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def summarize(pipe: Pipeline, res: SimResult, arrival_s: np.ndarray, agree: np.ndarray,
              slo_ms: float, warmup: float = 0.1) -> Summary:
    """Figures over the measurement window, from the arrival of the first request after
    the ``warmup`` fraction of the stream (an empty system flatters everyone) to the last
    arrival.

    goodput = answers within the SLO given during the window / its length: under overload,
    the rate a policy sustains within the SLO, whatever its queue did before (while
    arrivals keep up, the rate they come at); p50/p99 over the answered requests that
    arrived in the window; agreement = the fraction of them whose answer equals the full
    model's (``agree``: per request, for the exit it took); cost = devices the policy uses x
    their cost per second x 1,000 / goodput. Counts of answered, late and dropped requests
    are over the whole stream (they add up to it)."""
    a = np.asarray(arrival_s, dtype=np.float64)
    n = a.size
    start = math.floor(warmup * n)
    w = np.zeros(n, dtype=bool)
    w[start:] = True
    t0, t1 = (float(a[start]), float(a[-1])) if n > start else (0.0, 0.0)
    window_s = t1 - t0
    lat = (res.done_s - a) * 1e3
    ans = res.answered
    good = ans & (lat <= slo_ms + 1e-9)
    given = ans & (res.done_s >= t0) & (res.done_s <= t1)
    goodput = float((good & given).sum() / window_s) if window_s > 0 else 0.0
    lw = lat[ans & w]
    p50, p99 = (float(np.percentile(lw, q)) for q in (50, 99)) if lw.size else (math.nan,) * 2
    stages = len(pipe.stages)
    by_stage = tuple(int((res.dropped_at == i).sum()) for i in range(stages))
    span = float(np.nanmax(res.done_s) - a[0]) if ans.any() else 0.0  # first arrival to last answer
    util = tuple(b / (s.replicas * 1e3 * span) if span > 0 else 0.0
                 for b, s in zip(res.busy_ms, pipe.stages, strict=True))
    return Summary(
        goodput_rps=goodput, p50_ms=p50, p99_ms=p99,
        agreement=float(agree[ans & w].mean()) if (ans & w).any() else math.nan,
        cost=pipe.cost_per_s * 1e3 / goodput if goodput > 0 else math.inf,
        answered=int(ans.sum()), late=int((ans & ~good).sum()), dropped=int(sum(by_stage)),
        dropped_by_stage=by_stage,
        mean_batch=tuple(float(np.mean(r)) if r else 0.0 for r in res.batch_rows),
        utilisation=util, devices=pipe.devices, window_s=window_s)
