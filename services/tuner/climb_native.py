"""The compiled threshold climb (``climb.c``): the same hill climb as
``thresholds._climb_python``, without the interpreter's per-round overhead.

Built on first use by ``services.common.native`` (cached under ``$OFFRAMP_HOME/native``);
where no C compiler is found the tuner climbs in Python and ``failure()`` says why.
``OFFRAMP_TUNER_NATIVE=0`` forces the Python climb (to compare the two).
"""

from __future__ import annotations

import ctypes
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.common import native
from services.tuner.thresholds import Climb, Evaluation, Move, Replay, TuneResult

SOURCE = Path(__file__).with_name("climb.c")
ABI = 1
# no fused multiply-adds: the latency sums must be the Python climb's doubles
FLAGS = ("-O2", "-shared", "-fPIC", "-fvisibility=default", "-ffp-contract=off")

_P = ctypes.c_void_p
_I = ctypes.c_int64
_D = ctypes.c_double
_ARGS = [_I, _I, _P, _P, _P, _P, _I, _D, _D, _D, _I,   # window and parameters
         _P, _P, _P, _P, _P, _P, _P, _P,               # th ranks steps start counts dis rounds moves
         _P, _P, _P, _P, _P, _P]                       # per move: round ramp threshold step gain loss

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_failure: str | None = None


@dataclass(frozen=True)
class Climbed:
    """The climb's outcome in the Python climb's terms (indices, not ramp ids)."""

    thresholds: list[float]
    ranks: list[int]
    steps: list[float]
    start: list[float]
    counts: list[int]          # exits per active ramp, then the model's answers
    disagreements: int
    rounds: int
    moves: list[tuple[int, int, float, float, float, int]]  # round, index, threshold, step,
    #                                                         latency-sum gain, disagreements added


def load(folder: Path | None = None) -> ctypes.CDLL | None:
    """The loaded library, or None (see ``failure()``); cached per process."""
    global _lib, _failure
    with _lock:
        if _lib is None and _failure is None:
            try:
                path = native.build(SOURCE, folder if folder is not None else native.native_dir(),
                                    FLAGS)
                lib = ctypes.CDLL(str(path))
                if lib.offramp_climb_abi() != ABI:
                    raise RuntimeError(f"{path} has ABI {lib.offramp_climb_abi()}, want {ABI}")
                lib.offramp_climb.argtypes = _ARGS
                lib.offramp_climb.restype = ctypes.c_int32
                _lib = lib
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                _failure = f"the compiled threshold climb could not be built or loaded: {exc}"
        return _lib


def failure() -> str | None:
    return _failure


def enabled(wanted: bool = True) -> bool:
    """Whether the compiled climb runs: ``wanted`` (``Config.tuner_native``) and it loads."""
    return wanted and load() is not None


def engine(wanted: bool = True) -> str:
    """Which climb :func:`best_climb` gives here: "compiled" or "python"."""
    return "compiled" if enabled(wanted) else "python"


def climb(sorted_scores: np.ndarray, order: np.ndarray, wrong: np.ndarray, lat: np.ndarray,
          start: list[float], allowed: int, floor: float, initial_step: float,
          max_threshold: float, max_rounds: int) -> Climbed:
    """Run the compiled climb. ``sorted_scores``/``order``: R x N ascending scores and the
    stable argsort; ``wrong``: (R + 1) x N (last row: the model, never wrong); ``lat``: R + 1
    exit latencies; ``start``: capped start thresholds."""
    lib = load()
    if lib is None:
        raise RuntimeError(failure() or "no compiled climb")
    r, n = sorted_scores.shape
    s = np.ascontiguousarray(sorted_scores, dtype=np.float64)
    o = np.ascontiguousarray(order, dtype=np.int64)
    w = np.ascontiguousarray(wrong, dtype=np.uint8)
    la = np.ascontiguousarray(lat, dtype=np.float64)
    th = np.array(start, dtype=np.float64)
    ranks, counts = np.empty(r, np.int64), np.empty(r + 1, np.int64)
    steps, st = np.empty(r), np.empty(r)
    scalars = np.zeros(3, np.int64)  # disagreements, rounds, moves
    cap = max(int(max_rounds), 0)

    def addr(a: np.ndarray) -> int:
        return a.ctypes.data

    mv_i = np.empty((3, max(cap, 1)), np.int64)  # round, index, loss
    mv_d = np.empty((3, max(cap, 1)))            # threshold, step, gain
    sc = scalars.ctypes.data
    rc = lib.offramp_climb(r, n, addr(s), addr(o), addr(w), addr(la), int(allowed), float(floor),
                           float(initial_step), float(max_threshold), cap,
                           addr(th), addr(ranks), addr(steps), addr(st), addr(counts),
                           sc, sc + 8, sc + 16,
                           addr(mv_i[0]), addr(mv_i[1]), addr(mv_d[0]), addr(mv_d[1]),
                           addr(mv_d[2]), addr(mv_i[2]))
    if rc != 0:
        raise MemoryError("the compiled threshold climb could not allocate its scratch memory")
    m = int(scalars[2])
    moves = list(zip(mv_i[0, :m].tolist(), mv_i[1, :m].tolist(), mv_d[0, :m].tolist(),
                     mv_d[1, :m].tolist(), mv_d[2, :m].tolist(), mv_i[2, :m].tolist()))
    return Climbed(thresholds=th.tolist(), ranks=ranks.tolist(), steps=steps.tolist(),
                   start=st.tolist(), counts=counts.tolist(), disagreements=int(scalars[0]),
                   rounds=int(scalars[1]), moves=moves)


def compiled_climb(rp: Replay, th: list[float], allowed: int, floor: float,
                   initial_step: float, max_threshold: float, max_rounds: int) -> TuneResult:
    """``thresholds.tune``'s climb in compiled code (a ``thresholds.Climb``)."""
    # any order of tied scores does: a threshold never splits a tie (it passes all or none),
    # and the default sort is several times faster than a stable one
    order = np.argsort(rp.score, axis=1)
    wrong = ~rp.agree  # last row: the model, never wrong
    c = climb(np.take_along_axis(rp.score, order, axis=1), order, wrong,
                           rp.exit_lat, th, allowed, floor, initial_step, max_threshold,
                           max_rounds)
    n, ids = rp.n_samples, rp.window.ramp_ids
    lat_ms = rp.exit_lat.tolist()
    lat, covered = 0.0, 0
    for k in range(rp.n_ramps):  # as _Bits.evaluation forms it
        lat += c.counts[k] * lat_ms[k]
        covered += c.counts[k]
    mean = (lat + (n - covered) * lat_ms[rp.n_ramps]) / n
    ev = Evaluation(agreement=1.0 - c.disagreements / n, mean_latency_ms=mean,
                    exit_rates=tuple(x / n for x in c.counts[: rp.n_ramps]),
                    savings_ms=rp.profile.full_ms - mean, disagreements=c.disagreements,
                    samples=n)
    moves = tuple(Move(round=rnd, ramp_id=ids[i], threshold=t, step=st, gain_ms=g / n,
                       loss=loss / n) for rnd, i, t, st, g, loss in c.moves)
    return TuneResult(thresholds=tuple(c.thresholds), evaluation=ev, rounds=c.rounds,
                      moves=moves, steps=tuple(c.steps), start=tuple(c.start))


def best_climb(wanted: bool = True) -> Climb | None:
    """The climb a tuner passes to ``tune`` here: compiled when ``wanted``
    (``OFFRAMP_TUNER_NATIVE`` is not 0) and it builds, else None (the Python climb)."""
    return compiled_climb if enabled(wanted) else None
