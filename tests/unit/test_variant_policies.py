"""Variant policies on hand-worked tables: SlackFit's buckets and choices, MaxBatch,
MaxAcc, Clipper+ and INFaaS-like rules, the pareto filter, and EDF packing."""

from __future__ import annotations

import pytest

from services.router.edf_queue import EDFQueue, Pending
from services.router.policy import QueueView
from services.router.variant_policies import (
    FixedVariant,
    MaxAcc,
    MaxBatch,
    SlackFit,
    infaas_like,
    infaas_variant,
    slackfit_table,
)
from services.router.variant_table import Choice, VariantProfile, pareto

# latency(b): small b + 1 ms, large 3b + 2 ms (affine, so two measured sizes define them)
SMALL = VariantProfile("small", 0.70, (1, 16), (2.0, 17.0))
LARGE = VariantProfile("large", 0.80, (1, 16), (5.0, 50.0))
MID = VariantProfile("mid", 0.75, (1, 16), (4.0, 34.0))          # 2b + 2: on the frontier
WORSE = VariantProfile("worse", 0.69, (1, 16), (6.0, 51.0))      # slower and less accurate


def view(theta_ms: float, size: int = 100) -> QueueView:
    return QueueView(size=size, oldest_wait_ms=0.0, min_slack_ms=theta_ms - 10.0,
                     deadline_ms=theta_ms)


def test_latency_interpolates_and_extrapolates_per_sample():
    assert LARGE.latency(1) == 5.0 and LARGE.latency(16) == 50.0
    assert LARGE.latency(6) == pytest.approx(20.0)
    assert LARGE.latency(32) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="ascending"):
        VariantProfile("x", 0.5, (4, 1), (1.0, 2.0))
    with pytest.raises(ValueError, match="positive"):
        VariantProfile("x", 0.5, (1,), (0.0,))


def test_pareto_drops_variants_beaten_on_both_axes():
    assert [v.key for v in pareto([LARGE, WORSE, SMALL, MID])] == ["small", "mid", "large"]


def test_slackfit_bucket_table_by_hand():
    # lo = small@1 = 2 ms, hi = large@16 = 50 ms; 4 buckets: edges 2, 14, 26, 38, 50
    t = slackfit_table([SMALL, LARGE], max_batch=16, buckets=4)
    assert t.edges == (2.0, 14.0, 26.0, 38.0, 50.0)
    assert t.picks == (Choice("small", 13, 14.0, 0.70), Choice("small", 16, 17.0, 0.70),
                       Choice("large", 12, 38.0, 0.80), Choice("large", 16, 50.0, 0.80))


@pytest.mark.parametrize(("theta", "want"), [
    (100.0, ("large", 16)), (50.0, ("large", 16)), (45.0, ("large", 12)),
    (20.0, ("small", 16)), (16.0, ("small", 13)),
    (10.0, ("small", 9)),    # below every pick: the fastest variant's largest fit
    (1.0, ("small", 1)),     # nothing fits: the fastest choice there is
])
def test_slackfit_picks_the_bucket_closest_below_the_slack(theta, want):
    sf = SlackFit([SMALL, LARGE], max_batch=16, buckets=4)
    c = sf.choose(theta)
    assert (c.variant, c.batch) == want


def test_slackfit_decision_carries_the_variant_and_packs_what_waits():
    sf = SlackFit([SMALL, LARGE], max_batch=16, buckets=4, overhead_ms=5.0)
    d = sf.decide(view(50.0, size=3))          # theta 45 after the overhead: large x 12
    assert (d.batch_size, d.variant) == (3, "large")
    d = sf.decide(view(21.0, size=40))         # theta 16: small x 13
    assert (d.batch_size, d.variant) == (13, "small")
    assert sf.decide(view(50.0, size=0)).batch_size == 0


def test_slackfit_spends_slack_on_accuracy_when_the_queue_cannot_fill_its_pick():
    sf = SlackFit([SMALL, MID, LARGE], max_batch=16, buckets=4)
    # theta 20: the pick is small x 16 (17 ms). Three requests wait: large x 3 takes 11 ms
    d = sf.decide(view(20.0, size=3))
    assert (d.batch_size, d.variant) == (3, "large")
    # eight wait: large x 8 (26 ms) misses, mid x 8 (18 ms) fits
    d = sf.decide(view(20.0, size=8))
    assert (d.batch_size, d.variant) == (8, "mid")
    # the queue fills the pick: SlackFit's rule as is
    d = sf.decide(view(20.0, size=40))
    assert (d.batch_size, d.variant) == (16, "small")
    # nothing more accurate fits the queue's batch: the pick, packed with what waits
    d = sf.decide(view(10.0, size=5))       # small x 9 is the pick; mid x 5 = 12 ms
    assert (d.batch_size, d.variant) == (5, "small")


@pytest.mark.parametrize(("theta", "want"), [
    (60.0, ("large", 16)), (45.0, ("small", 16)), (20.0, ("small", 16)),
    (8.0, ("small", 7)), (1.0, ("small", 1))])
def test_maxbatch_rule(theta, want):
    c = MaxBatch([LARGE, SMALL], max_batch=16).choose(theta)
    assert (c.variant, c.batch) == want


@pytest.mark.parametrize(("theta", "want"), [
    (60.0, ("large", 16)), (20.0, ("large", 6)), (4.0, ("small", 3)), (1.0, ("small", 1))])
def test_maxacc_rule(theta, want):
    c = MaxAcc([SMALL, LARGE], max_batch=16).choose(theta)
    assert (c.variant, c.batch) == want


def test_fixed_variant_and_infaas_like_rules():
    clipper = FixedVariant([SMALL, LARGE], "large", max_batch=16)
    assert (clipper.choose(20.0).variant, clipper.choose(20.0).batch) == ("large", 6)
    assert clipper.choose(1.0).batch == 1
    with pytest.raises(ValueError, match="unknown variant 'huge'"):
        FixedVariant([SMALL], "huge")
    assert infaas_variant([LARGE, SMALL, MID]) == "small"
    assert infaas_variant([LARGE, SMALL, MID], floor=0.72) == "mid"
    with pytest.raises(ValueError, match="no variant reaches accuracy 0.9"):
        infaas_variant([LARGE, SMALL], floor=0.9)
    inf = infaas_like([LARGE, SMALL, MID], floor=0.78)
    assert inf.name == "infaas" and inf.choose(100.0).variant == "large"


def test_edf_packing_takes_the_most_urgent_requests():
    q = EDFQueue(limit=100)
    for i, deadline in enumerate([9.0, 3.0, 7.0, 1.0, 5.0]):
        q.push(Pending(f"r{i}", "m", "reply", {}, arrival=0.0, deadline=deadline))
    d = SlackFit([SMALL, LARGE], max_batch=16, buckets=4).decide(view(4.0, size=len(q)))
    assert (d.batch_size, d.variant) == (3, "small")   # theta 4 ms: small x 3
    assert [p.id for p in q.pop(d.batch_size)] == ["r3", "r1", "r4"]


def test_measured_dips_read_flat_and_pareto_compares_whole_curves():
    dip = VariantProfile("dip", 0.8, (1, 2, 4), (5.0, 4.0, 6.0))
    assert [dip.latency(b) for b in (1, 2, 3, 4)] == [5.0, 5.0, 5.5, 6.0]
    # faster at batch 1 but slower at batch 16 than LARGE, and less accurate: both stay
    early = VariantProfile("early", 0.78, (1, 16), (4.0, 60.0))
    assert [v.key for v in pareto([LARGE, early])] == ["early", "large"]
    # as accurate as LARGE and no faster anywhere: dominated
    slow = VariantProfile("slow", 0.80, (1, 16), (5.0, 55.0))
    assert [v.key for v in pareto([slow, LARGE])] == ["large"]


def drained(theta_ms: float, size: int, workers: int, deadlines=()) -> QueueView:
    return QueueView(size=size, oldest_wait_ms=0.0, min_slack_ms=0.0, deadline_ms=theta_ms,
                     workers=workers, deadlines_ms=tuple(deadlines))


@pytest.mark.parametrize(("size", "workers", "want"), [
    (12, 1, ("large", 12)),   # one round: SlackFit's own pick (38 ms <= 45)
    (16, 1, ("small", 13)),   # large x 12 takes two rounds (76 ms); small x 13 28 ms
    # 40 on two workers: two rounds. large x 12 would drain at 76 ms; small x 16 at 34 ms,
    # closest below 45 (small x 13 drains at 28)
    (40, 2, ("small", 16)),
    (40, 4, ("large", 12)),   # four workers clear it in one round of large x 12
])
def test_slackfit_drains_the_queue_over_the_workers(size, workers, want):
    sf = SlackFit([SMALL, LARGE], max_batch=16, buckets=4)
    d = sf.decide(drained(45.0, size, workers))
    assert (d.variant, d.batch_size) == want


def test_slackfit_saves_the_most_requests_per_ms_when_nothing_drains_in_time():
    sf = SlackFit([SMALL, LARGE], max_batch=16, buckets=4)
    # 100 wait, the head has 3 ms. Its own pick, small x 2 (3 ms), saves 0.67 per ms;
    # small x 16 (17 ms) loses the head and saves the 15 behind it, which have 20 ms
    d = sf.decide(drained(3.0, 100, 1, [3.0] + [20.0] * 15))
    assert (d.variant, d.batch_size) == ("small", 16)
    # the same queue where everyone is as late as the head: only the head's pick saves any
    d = sf.decide(drained(3.0, 100, 1, [3.0] * 16))
    assert (d.variant, d.batch_size) == ("small", 2)
    # unseen deadlines read as the last seen one's
    d = sf.decide(drained(3.0, 100, 1, [3.0, 20.0]))
    assert (d.variant, d.batch_size) == ("small", 16)


def test_a_live_slowdown_shrinks_the_slack_in_profile_time():
    sf = SlackFit([SMALL, LARGE], max_batch=16, buckets=4)
    calm = QueueView(size=16, oldest_wait_ms=0.0, min_slack_ms=0.0, deadline_ms=50.0)
    slow = QueueView(size=16, oldest_wait_ms=0.0, min_slack_ms=0.0, deadline_ms=50.0,
                     slowdown=2.5)
    assert sf.decide(calm).variant == "large"          # theta 50: large x 16
    d = sf.decide(slow)                                  # theta 20 in profile time
    assert (d.variant, d.batch_size) == ("small", 16)
    fixed = FixedVariant([LARGE], "large")
    assert fixed.decide(slow).batch_size == 6            # 3b + 2 <= 20
