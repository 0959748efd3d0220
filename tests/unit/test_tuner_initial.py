"""The initial deployment (services/exits/initial.py): as many ramps as the budget allows,
spread evenly: the evenly spaced sites when they fit, else each slice's cheapest ramp."""

from __future__ import annotations

from services.exits.initial import evenly_spaced, initial_active, slices

# Serving costs (ms) measured by `offramp prepare efficientnet-lite0` on the 2-core machine;
# the model's chained blocks take 7.94 ms, so a 2 % budget is 0.159 ms.
EFFNET = dict(zip(range(12), [0.508, 0.306, 0.14, 0.672, 0.548, 0.165, 0.464, 0.55, 0.61,
                              0.385, 0.148, 0.192], strict=True))


def test_equal_costs_give_evenly_spaced_ramps():
    ids = list(range(12))
    for k in range(1, 13):
        assert initial_active(dict.fromkeys(ids, 1.0), 100.0, k / 100.0) == evenly_spaced(ids, k)


def test_a_cheap_neighbour_stands_in_for_a_costly_centre():
    # The single evenly spaced site (6) costs 0.464 ms; ramp 2 (0.14 ms) fits the budget.
    assert evenly_spaced(list(range(12)), 1) == [6]
    assert initial_active(EFFNET, 7.9351, 0.02) == [2]


def test_centres_that_fit_are_kept_even_when_a_neighbour_is_cheaper():
    # the costs of one 2-core machine's EfficientNet ramps: centres 3 and 9 fit (0.114 ms of
    # a 0.1146 ms budget) though 6 and 10 measured a few microseconds cheaper
    costs = dict(zip(range(12), [0.118, 0.088, 0.082, 0.043, 0.048, 0.048, 0.037, 0.080,
                                 0.060, 0.071, 0.059, 0.089], strict=True))
    assert evenly_spaced(list(range(12)), 2) == [3, 9]
    assert initial_active(costs, 5.73, 0.02) == [3, 9]
    costs[9] = 0.075  # now the centres do not fit: each slice's cheapest stands in
    assert initial_active(costs, 5.73, 0.02) == [6, 10]


def test_more_budget_more_ramps_each_the_cheapest_of_its_slice():
    pick = initial_active(EFFNET, 7.9351, 0.25)
    assert sum(EFFNET[r] for r in pick) <= 0.25 * 7.9351
    assert len(pick) == 7
    centres = evenly_spaced(list(range(12)), 7)
    for r, part in zip(pick, slices(list(range(12)), centres), strict=True):
        assert r in part and EFFNET[r] == min(EFFNET[x] for x in part)


def test_nothing_fits_and_unknown_latency():
    assert initial_active({0: 1.0, 1: 2.0}, 10.0, 0.05) == []
    assert initial_active({0: 1.0, 1: 2.0}, 0.0, 0.02) == [0, 1]  # no latency known: all


def test_slices_cover_every_site_once_around_their_centres():
    for n in range(1, 20):
        ids = list(range(100, 100 + n))
        for k in range(1, n + 1):
            centres = evenly_spaced(ids, k)
            parts = slices(ids, centres)
            assert [x for p in parts for x in p] == ids
            assert all(c in p for c, p in zip(centres, parts, strict=True))
