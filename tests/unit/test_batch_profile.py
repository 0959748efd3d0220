"""Online batch profile (pure): survival from exits, windows, drift, MAPE/WAPE."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest

from services.profiler.batch_profile import (
    DRIFT_THRESHOLD,
    FINAL,
    compare,
    drifted,
    exit_array,
    group_windows,
    mape,
    sampling_mape,
    survival,
    wape,
    window_start,
)


def test_survival_hand_computed():
    # 8 samples, ramps 1, 3, 5: two exit at 1, one at 3, none at 5, five run to the end.
    exits = [1, -1, 3, -1, 1, -1, -1, -1]
    assert survival(exits, [1, 3, 5]) == (6 / 8, 5 / 8, 5 / 8)


def test_survival_of_telemetry_exit_at_array_and_none_as_final():
    exit_at = np.array([0, 2, -1, 2], np.int32)  # SampleTelemetry.exit_at
    assert survival(exit_at, [0, 2]) == (0.75, 0.25)
    assert survival([0, None, None, 2], [0, 2]) == (0.75, 0.5)


def test_exit_at_a_ramp_not_listed_counts_from_that_depth():
    # Ramp 2 was active earlier in the window: its sample left before ramp 4 all the same.
    assert survival([2, -1, -1, 6], [1, 4, 7]) == (1.0, 0.75, 0.5)


def test_survival_is_non_increasing_on_random_exits():
    rng = np.random.default_rng(0)
    exits = rng.choice([-1, 0, 1, 2, 3, 4], size=500)
    s = survival(exits, [0, 1, 2, 3, 4])
    assert all(a >= b for a, b in pairwise(s))
    assert s[-1] == pytest.approx(float(np.mean(exits == FINAL)))


def test_empty_window_has_no_survival_and_no_ramps_has_empty_profile():
    assert survival([], [0, 1]) is None
    assert survival(np.zeros(0, np.int32), [0]) is None
    assert survival([0, -1], []) == ()


def test_nothing_exits_means_full_survival_and_everything_at_first_ramp_means_zero():
    assert survival([-1, -1, -1], [0, 3]) == (1.0, 1.0)
    assert survival([0, 0], [0, 3]) == (0.0, 0.0)


def test_ramps_must_be_ascending_and_distinct():
    with pytest.raises(ValueError):
        survival([0, 1], [3, 1])
    with pytest.raises(ValueError):
        survival([0, 1], [1, 1])


def test_exit_array_accepts_one_exit_or_many():
    assert exit_array(3).tolist() == [3]
    assert exit_array(None).tolist() == [FINAL]
    assert exit_array([1, None]).tolist() == [1, FINAL]
    assert exit_array(np.array([[0, 1]], np.int32)).dtype == np.int64


def test_window_start_is_aligned():
    assert window_start(0.0) == 0.0
    assert window_start(19.99) == 10.0
    assert window_start(20.0, 10.0) == 20.0
    assert window_start(7.0, 2.5) == 5.0
    with pytest.raises(ValueError):
        window_start(1.0, 0.0)


def test_group_windows_by_sample_and_by_message():
    records = [(101.0, 0), (105.0, -1), (99.0, np.array([1, -1], np.int32)),
               (120.5, [2, 2, -1]), (125.0, [])]
    windows = group_windows(records, 10.0)
    assert [w.start for w in windows] == [90.0, 100.0, 120.0]
    assert [w.exits.tolist() for w in windows] == [[1, -1], [0, -1], [2, 2, -1]]
    assert survival(windows[2].exits, [2]) == (1 / 3,)


def test_a_window_with_only_empty_messages_is_not_a_window():
    assert group_windows([(5.0, []), (15.0, [0])], 10.0)[0].start == 10.0
    assert group_windows([], 10.0) == []


def test_compare_hand_computed():
    d = compare([0.8, 0.5, 0.3], [0.75, 0.62, 0.3])
    assert d.errors == pytest.approx((0.05, 0.12, 0.0))
    assert d.max_error == pytest.approx(0.12)
    assert d.drifted
    assert not compare([0.8, 0.5], [0.75, 0.55]).drifted
    assert compare([], []).max_error == 0.0


def test_drift_threshold_is_strict_and_configurable():
    assert DRIFT_THRESHOLD == 0.1
    assert not drifted([0.5], [0.5 + 0.0625], threshold=0.0625)  # exactly at: not drifted
    assert drifted([0.5], [0.5625], threshold=0.06)
    assert drifted([0.9, 0.2], [0.9, 0.45])


def test_drift_needs_both_sides_and_the_same_ramps():
    assert not drifted(None, [0.5])
    assert not drifted([0.5], None)
    with pytest.raises(ValueError):
        drifted([0.5, 0.4], [0.5])


def test_mape_hand_computed_over_windows_and_ramps():
    forecasts = [[0.5, 0.2], [0.4, 0.1]]
    observed = [[0.4, 0.25], [0.5, 0.1]]
    # |.1|/.4 = 25 %, |.05|/.25 = 20 %, |.1|/.5 = 20 %, 0 % -> mean 16.25 %
    assert mape(forecasts, observed) == pytest.approx(16.25)


def test_mape_skips_observed_below_floor_and_missing_windows():
    forecasts = [[0.5, 0.05], None, [0.4, 0.3]]
    observed = [[0.4, 0.0], [0.5, 0.5], None]
    assert mape(forecasts, observed) == pytest.approx(25.0)   # only 0.5 vs 0.4 counts
    assert mape([[0.1]], [[0.005]]) is None                    # below the floor
    assert mape([[0.1]], [[0.005]], floor=0.001) == pytest.approx(1900.0)
    assert mape([], []) is None


def test_wape_is_total_error_over_total_observed():
    forecasts = [[0.5, 0.05], [0.4, 0.1]]
    observed = [[0.4, 0.0], [0.5, 0.1]]
    assert wape(forecasts, observed) == pytest.approx(100 * 0.25 / 1.0)
    assert wape([[0.1]], [[0.0]]) is None
    assert wape([None], [[0.3]]) is None


def test_sampling_mape_matches_a_perfect_forecaster_on_binomial_windows():
    """A forecaster that knows the true survival scores, from sampling alone, what
    ``sampling_mape`` predicts from the observed windows."""
    rng = np.random.default_rng(7)
    p, n = 0.2, 400
    obs = rng.binomial(n, p, 4000) / n
    perfect = mape([[p]] * obs.size, [[o] for o in obs])
    assert sampling_mape(obs, [n] * obs.size) == pytest.approx(perfect, rel=0.05)
    assert sampling_mape([0.2], [1600]) == pytest.approx(sampling_mape([0.2], [400]) / 2)
    assert sampling_mape([0.0, 0.5], [100, 0]) is None


def test_mape_needs_aligned_windows():
    with pytest.raises(ValueError):
        mape([[0.5]], [[0.5], [0.4]])
    assert math.isclose(mape([np.array([0.3])], [np.array([0.3])]), 0.0)
