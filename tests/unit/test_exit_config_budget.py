"""``offramp exit-config``: a hand-set active set over the ramp budget is stored, with a
note of what it costs."""

from services.exits.latency_profile import LatencyProfile
from services.launcher.exit_config import over_budget, thresholds_asked

# four ramps of 0.1 ms each on a 10 ms model: 2 % allows two
PROF = LatencyProfile.build([1.0, 3.0, 5.0, 7.0, 10.0], [0.1, 0.1, 0.1, 0.1])
IDS = [2, 4, 6, 8]


def test_within_the_budget_no_note():
    assert over_budget(PROF, IDS, [2, 6], 0.02) is None
    assert over_budget(PROF, IDS, [], 0.02) is None


def test_over_the_budget_the_note_names_cost_share_and_budget():
    note = over_budget(PROF, IDS, [2, 4, 6, 8], 0.02)
    assert note is not None
    assert "0.400 ms" in note and "4.0%" in note and "2.0%" in note
    assert "OFFRAMP_RAMP_BUDGET" in note


def test_set_overrides_threshold_for_its_ramp():
    out = thresholds_asked({2: 0.0, 4: 0.0}, [2, 4], 0.3, ["4=0.7"])
    assert out == {2: 0.3, 4: 0.7}
