"""Shadow sampling: deterministic per request id and seed, and unbiased at its rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.exits.shadow import ShadowSampler


def binomial_bound(n: int, p: float, z: float = 5.0) -> float:
    """Half-width of a z-sigma band around n * p (z = 5: a false alarm ~1 in 3.5 million)."""
    return z * math.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("rate", [0.01, 0.05, 0.2, 0.5])
@pytest.mark.parametrize("ids", ["sequential", "uuid-like", "short"])
def test_unbiased_within_a_binomial_bound(rate, ids):
    n = 20_000
    if ids == "uuid-like":
        halves = np.random.default_rng(7).integers(0, 2**63, size=(n, 2))
        names = [f"{a:016x}{b:016x}" for a, b in halves]
    else:
        names = [f"job-{i}" if ids == "sequential" else str(i) for i in range(n)]
    s = ShadowSampler(rate, seed=3)
    picked = sum(s.picks(r) for r in names)
    assert abs(picked - n * rate) <= binomial_bound(n, rate), (picked, n * rate)


def test_sequential_ids_are_not_picked_in_a_pattern():
    # consecutive blocks of 1,000 sequential ids each get their share, not all or nothing
    s = ShadowSampler(0.05, seed=0)
    per_block = [sum(s.picks(f"req-{b * 1000 + i}") for i in range(1000)) for b in range(20)]
    assert all(abs(k - 50) <= binomial_bound(1000, 0.05) for k in per_block), per_block


def test_deterministic_per_id_and_seed():
    a, b = ShadowSampler(0.3, seed=1), ShadowSampler(0.3, seed=1)
    ids = [f"r{i}" for i in range(2000)]
    assert [a.picks(r) for r in ids] == [b.picks(r) for r in ids]
    other = ShadowSampler(0.3, seed=2)
    assert [a.picks(r) for r in ids] != [other.picks(r) for r in ids]  # the seed matters
    # a higher rate picks a superset: raising the rate only adds shadow samples
    more = ShadowSampler(0.6, seed=1)
    assert all(more.picks(r) for r in ids if a.picks(r))


def test_edges_and_the_batch_mask():
    assert not any(ShadowSampler(0.0).picks(f"{i}") for i in range(1000))
    assert all(ShadowSampler(1.0).picks(f"{i}") for i in range(1000))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ShadowSampler(1.5)
    # the batch mask is picks() per id, exited or not (the feedback sample)
    ids = [f"r{i}" for i in range(200)]
    half = ShadowSampler(0.5, seed=3)
    assert half.selected(ids).tolist() == [half.picks(r) for r in ids]
    assert ShadowSampler(1.0).selected(["a", "b"]).tolist() == [True, True]
    assert ShadowSampler(0.0).selected(["a", "b"]).tolist() == [False, False]
    assert ShadowSampler(0.5).selected([]).tolist() == []
