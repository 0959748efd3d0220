"""The variant-serving replay: EDF dispatch to free workers, drops at the deadline,
attainment and accuracy as SuperServe defines them, worker faults, and timelines."""

from __future__ import annotations

import numpy as np
import pytest

from services.router.variant_policies import FixedVariant, SlackFit
from services.router.variant_table import VariantProfile
from services.sim.variant_sim import alive_at, simulate, timeline

FLAT = VariantProfile("flat", 0.9, (1, 16), (10.0, 10.0))       # 10 ms at any batch
SMALL = VariantProfile("small", 0.70, (1, 16), (2.0, 17.0))
LARGE = VariantProfile("large", 0.80, (1, 16), (5.0, 50.0))


def test_hand_worked_single_worker():
    arr = np.array([0.0, 0.001, 0.002])
    log = simulate(FixedVariant([FLAT], "flat"), {"flat": FLAT}, arr, slo_ms=25.0, workers=1)
    # t=0: the first alone, done at 10 ms; t=10 ms: the other two together, done at 20 ms
    np.testing.assert_allclose(log.finish, [0.010, 0.020, 0.020])
    assert log.attained.all() and log.batch_size.tolist() == [1, 2]
    assert log.mean_accuracy == pytest.approx(0.9)
    # SLO 15 ms: at 10 ms the head has 6 ms left, no batch fits, so the fastest choice
    # (batch 1) runs; it ends at 20 ms, past both its deadline and the third's
    log = simulate(FixedVariant([FLAT], "flat"), {"flat": FLAT}, arr, slo_ms=15.0, workers=1)
    np.testing.assert_allclose(log.finish[:2], [0.010, 0.020])
    assert np.isnan(log.finish[2])
    assert log.attained.tolist() == [True, False, False]
    assert log.attainment == pytest.approx(1 / 3)


def test_slackfit_drains_a_burst_that_outlasts_one_round():
    # 200 requests at once, 2 workers, SLO 150 ms. Fitting one batch to the head's slack,
    # large x 16 (50 ms) looks fine three times, and only 54 % attain; draining
    # 200 over 2 workers fits only with small x 16: 7 rounds of 17 ms
    table = {"small": SMALL, "large": LARGE}
    log = simulate(SlackFit([SMALL, LARGE], 16, buckets=4), table, np.zeros(200),
                   slo_ms=150.0, workers=2)
    assert log.attainment == 1.0
    assert log.batch_variant[:2] == ["small", "small"]   # large only once the rest fits


def test_requests_past_their_deadline_in_the_queue_are_dropped():
    arr = np.array([0.0, 0.001, 0.002])
    log = simulate(FixedVariant([FLAT], "flat"), {"flat": FLAT}, arr, slo_ms=5.0, workers=1)
    # the second and third expire (deadlines 6 and 7 ms) while the first runs until 10 ms
    assert np.isnan(log.finish[1:]).all() and log.batch_size.tolist() == [1]
    assert log.attained.tolist() == [False, False, False]   # the first finished at 10 > 5


def test_two_workers_share_the_load_and_faults_remove_one():
    arr = np.arange(0.0, 1.0, 0.004)              # 250 req/s, 1 s
    pol = FixedVariant([FLAT], "flat", max_batch=1)
    both = simulate(pol, {"flat": FLAT}, arr, slo_ms=10_000.0, workers=2)
    one = simulate(pol, {"flat": FLAT}, arr, slo_ms=10_000.0, workers=2, faults=[(0.0, 1)])
    assert both.batch_size.size == one.batch_size.size == 250
    assert np.nanmax(one.finish) == pytest.approx(2.5, abs=0.02)   # 250 x 10 ms on one
    assert np.nanmax(both.finish) < 1.3
    assert alive_at([(1.0, 1), (2.0, 2)], 2, 1.5) == 1
    assert alive_at([(1.0, 1), (2.0, 2)], 2, 2.5) == 2


def test_a_worker_comes_back_when_the_fault_ends():
    arr = np.arange(0.0, 2.0, 0.004)
    pol = FixedVariant([FLAT], "flat", max_batch=1)
    log = simulate(pol, {"flat": FLAT}, arr, slo_ms=10_000.0, workers=2,
                   faults=[(0.0, 1), (1.0, 2)])
    # one worker until 1 s (100 done), then two
    assert np.nanmax(log.finish) == pytest.approx(1.0 + (500 - 100) * 0.010 / 2, abs=0.03)


def test_slackfit_holds_attainment_under_a_burst_where_the_large_variant_does_not():
    rng = np.random.default_rng(0)
    calm = np.sort(rng.uniform(0.0, 1.0, 50))
    burst = np.sort(rng.uniform(1.0, 1.5, 300))          # 600 req/s for 500 ms
    arr = np.concatenate([calm, burst])
    table = {"small": SMALL, "large": LARGE}
    large = simulate(FixedVariant([SMALL, LARGE], "large"), table, arr, 60.0, workers=1)
    fit = simulate(SlackFit([SMALL, LARGE], buckets=8), table, arr, 60.0, workers=1)
    assert large.attainment < 0.7
    assert fit.attainment > 0.95
    assert fit.mean_accuracy > 0.7             # large while calm, small in the burst
    assert "large" in fit.batch_variant and "small" in fit.batch_variant


def test_timeline_bins_rate_attainment_and_accuracy():
    arr = np.array([0.1, 0.2, 1.5])
    log = simulate(FixedVariant([FLAT], "flat"), {"flat": FLAT}, arr, 100.0, workers=1)
    tl = timeline(log, 1.0)
    assert tl["t"] == [0.0, 1.0] and tl["rate"] == [2.0, 1.0]
    assert tl["attainment"] == [1.0, 1.0] and tl["accuracy"] == [0.9, 0.9]
    assert tl["batch"] == [1.0, 1.0]
