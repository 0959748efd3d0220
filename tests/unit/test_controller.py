"""The Apparate control loop (services.tuner.controller): alerts, slack tunes, adjust cadence,
feedback hygiene after active-set changes, serialisation and determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest

from services.common.stats import wilson_interval
from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.tuner.controller import (
    COMPUTE_TUNE_WINDOW,
    ExitController,
    TunerDecision,
    mode_controller,
)
from services.tuner.thresholds import (
    evaluate,
    interval_alert_limit,
    interval_tune_limit,
    meets,
    tune,
)

# 4 sites of a 10 ms model; a ramp costs 0.05 ms (budget 2% = 0.2 ms: up to 4 ramps)
PROFILE = LatencyProfile.build([2.0, 4.0, 6.0, 8.0, 10.0], [0.05] * 4)


def batch(ids: tuple[int, ...], n: int, seed: int, wrong: float = 0.0,
          wrong_score: float = 0.05) -> ExitWindow:
    """Ramps agree with the final model at low scores (0.02-0.1) except a ``wrong`` share of
    samples, where every ramp is confidently wrong (score ``wrong_score``)."""
    rng = np.random.default_rng(seed)
    final = rng.integers(0, 5, n)
    pred = np.tile(final, (len(ids), 1))
    score = rng.uniform(0.02, 0.1, (len(ids), n))
    bad = rng.random(n) < wrong
    pred[:, bad] = (final[bad] + 1) % 5
    score[:, bad] = wrong_score
    return ExitWindow.build(ids, pred, score, final)


def ctl(active=(1, 2), thresholds=None, **kw) -> ExitController:
    kw.setdefault("slack_windows", None)
    return ExitController(PROFILE, active, thresholds, **kw)


def test_alert_tune_meets_the_constraint_on_the_bad_window() -> None:
    c = ctl(thresholds=(0.5, 0.5))
    bad = batch((1, 2), 16, seed=1, wrong=0.25)
    assert not meets(evaluate(bad, PROFILE, (0.5, 0.5)), 0.01)
    decisions = c.observe(bad)
    assert [(d.kind, d.trigger) for d in decisions] == [("tune", "alert")]
    d = decisions[0]
    assert d.changed and d.version == 1 and d.window_agreement < 0.99
    assert meets(evaluate(bad, PROFILE, d.thresholds), 0.01)
    assert c.thresholds == d.thresholds and c.counts["alerts"] == 1
    # ramp 1 answered the wrong samples (score 0.05): backed off to 0.25 x 0.05
    assert d.thresholds[0] <= 0.25 * 0.05 + 1e-12 and "backed off" in d.reason


def test_an_alert_never_raises_a_threshold() -> None:
    # Ramp 1 is cautious (0.01) and never answers wrongly here; ramp 2 (0.5) does. Tuned from
    # zero on this feedback ramp 1 alone would go up to just below the wrong scores (0.05),
    # but an alert says the deployed config is too eager: its re-tune only lowers (raising
    # is the slack tune's job, once enough feedback holds every active ramp).
    c = ctl(thresholds=(0.01, 0.5))
    c.observe(batch((1, 2), 16, seed=3))
    d = c.observe(batch((1, 2), 16, seed=1, wrong=0.25))
    assert [x.trigger for x in d] == ["alert"] and d[0].changed
    assert all(new <= old for new, old in zip(d[0].thresholds, (0.01, 0.5)))
    assert "no threshold raised" in d[0].reason
    assert tune(c.recent(c.tune_window), PROFILE, c.tune_constraint).thresholds[0] > 0.01


def test_no_alert_raises_a_threshold_on_varied_feedback() -> None:
    reasons = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        c = ctl(thresholds=tuple(rng.uniform(0.0, 0.6, 2)), tune_window=int(rng.integers(16, 64)))
        for k in range(6):
            before = c.thresholds
            for d in c.observe(batch((1, 2), int(rng.integers(4, 24)), seed=100 * seed + k,
                                     wrong=float(rng.uniform(0, 0.4)),
                                     wrong_score=float(rng.uniform(0.01, 0.3)))):
                if d.trigger == "alert":
                    assert all(n <= o for n, o in zip(d.thresholds, before)), d.reason
                    reasons.append(d.reason)
                before = c.thresholds
    assert len(reasons) > 20 and any("capped by the alert window" in r for r in reasons)


def test_an_alert_no_repair_fits_switches_off_only_the_ramps_that_failed() -> None:
    # Ramp 1 is right at 0.5-0.6 but confidently wrong (0.25) on a tenth of the samples, so
    # tunes keep it below 0.25; ramp 2 is right at 0.02-0.1. Then a sample passes ramp 1
    # (0.3) and ramp 2 answers it wrongly at 0.01: the tune on 241 samples may keep that one
    # miss, the alert window's own tune exits it at ramp 1 (above the deployed 0.2) and the
    # min of the two lets it through to ramp 2 again. Ramp 2 goes off; ramp 1 keeps serving.
    rng = np.random.default_rng(0)
    n = 240
    final = rng.integers(0, 5, n)
    pred = np.tile(final, (2, 1))
    score = np.vstack([rng.uniform(0.5, 0.6, n), rng.uniform(0.02, 0.1, n)])
    trap = rng.random(n) < 0.1
    pred[0, trap] = (final[trap] + 1) % 5
    score[0, trap] = 0.25
    c = ctl(thresholds=(0.2, 0.5), adjust_every=10_000)
    assert c.observe(ExitWindow.build((1, 2), pred, score, final)) == []
    x = ExitWindow.build((1, 2), np.array([[3], [4]]), np.array([[0.3], [0.01]]), np.array([3]))
    (d,) = c.observe(x)
    assert d.trigger == "alert" and d.thresholds == (0.2, 0.0)
    assert "ramps [2] off" in d.reason and meets(evaluate(x, PROFILE, d.thresholds), 0.01)


def test_tunes_keep_headroom_below_the_constraint() -> None:
    assert ctl().tune_constraint == 0.005  # half the 1% constraint by default
    w = batch((1, 2), 400, seed=13, wrong=0.02, wrong_score=0.05)
    c = ctl(slack_windows=1, tune_window=400, adjust_every=10_000)
    c.observe(w)
    assert evaluate(w, PROFILE, c.thresholds).disagreements <= 2  # 0.5% of 400


def test_alert_fires_at_the_first_disagreement_that_dooms_the_window() -> None:
    c = ctl(thresholds=(0.5, 0.5))
    assert c.observe(batch((1, 2), 5, seed=2)) == []
    one_bad = batch((1, 2), 1, seed=3, wrong=1.0)
    d = c.observe(one_bad)
    assert [x.trigger for x in d] == ["alert"]  # 6 of 16 samples: 1 > floor(1% of 16) = 0
    assert c.win_n == 0  # the window closed with the alert


@pytest.mark.parametrize(("n", "constraint"), [(16, 0.01), (16, 0.05), (64, 0.01),
                                               (64, 0.05), (256, 0.02)])
def test_interval_alert_limit_is_where_the_agreement_upper_bound_drops_below_target(
        n: int, constraint: float) -> None:
    k = interval_alert_limit(n, constraint)
    assert wilson_interval(n - k, n)[1] >= 1 - constraint  # k disagreements: no alert
    assert wilson_interval(n - k - 1, n)[1] < 1 - constraint  # one more: alert


@pytest.mark.parametrize(("n", "constraint"), [(1024, 0.01), (2048, 0.01), (4096, 0.01),
                                               (256, 0.05)])
def test_interval_tune_limit_keeps_the_agreement_lower_bound_at_the_target(
        n: int, constraint: float) -> None:
    k = interval_tune_limit(n, constraint)
    assert 0 < k < constraint * n  # stricter than the point estimate
    assert wilson_interval(n - k, n)[0] >= 1 - constraint
    assert wilson_interval(n - k - 1, n)[0] < 1 - constraint


def test_interval_tune_limit_allows_nothing_on_few_samples() -> None:
    assert [interval_tune_limit(n, 0.01) for n in (0, 1, 16, 512)] == [0, 0, 0, 0]
    assert interval_tune_limit(2048, 0.01) == 11


def _sampled_stream(n: int, wrong: int, wrong_score: float) -> ExitWindow:
    """``n`` samples whose ramps are right at scores 0.02-0.1 except ``wrong`` of them,
    evenly spread, where every ramp is wrong at ``wrong_score``."""
    w = batch((1, 2), n, seed=11)
    pred, score = w.pred.copy(), w.score.copy()
    bad = np.linspace(0, n - 1, wrong).astype(int)
    pred[:, bad] = (w.final[bad] + 1) % 5
    score[:, bad] = wrong_score
    return ExitWindow.build((1, 2), pred, score, w.final)


@pytest.mark.parametrize("sampled", [False, True])
def test_a_tune_on_sampled_feedback_leaves_only_what_the_interval_allows(sampled) -> None:
    """1,024 samples, 5 of them wrong at score 0.3, under thresholds (0.2) that keep every
    wrong one from exiting: no alert, and a savings tune once 1,024 samples are in. The point
    estimate at the headroom (0.5 % of 1,024: 5) lets the thresholds pass 0.3 and the five
    mistakes out; the interval's lower bound allows 3, so they stay in (exit: score < 0.3)."""
    c = ctl(thresholds=(0.2, 0.2), slack_windows=1, tune_window=1024, min_tune_samples=1024,
            adjust_every=10**9, sampled_feedback=sampled)
    stream = _sampled_stream(1024, 5, 0.3)
    got = []
    for i in range(0, 1024, 16):
        got += c.observe(ExitWindow.build((1, 2), stream.pred[:, i:i + 16],
                                          stream.score[:, i:i + 16], stream.final[i:i + 16]))
    assert c.counts["alerts"] == 0 and got[-1].trigger == "slack" and got[-1].tuned_on == 1024
    wrong_out = evaluate(stream, PROFILE, c.thresholds).disagreements
    if sampled:
        assert max(c.thresholds) <= 0.3 and wrong_out == 0  # 5 > the 3 allowed: none out
    else:
        assert max(c.thresholds) > 0.3 and wrong_out == 5


def test_compute_mode_tunes_on_sampled_feedback_and_latency_mode_does_not() -> None:
    compute = mode_controller(PROFILE, (1, 2), (0.1, 0.1), compute=True)
    latency = mode_controller(PROFILE, (1, 2), (0.1, 0.1), compute=False)
    assert compute.sampled_feedback and compute.tune_window == COMPUTE_TUNE_WINDOW
    assert not latency.sampled_feedback and latency.tune_window < COMPUTE_TUNE_WINDOW
    assert compute.tune_constraint_on(512) == 0.0
    assert latency.tune_constraint_on(512) == latency.tune_constraint
    assert ExitController.from_dict(compute.to_dict()).sampled_feedback


def test_interval_alert_is_apparates_rule_at_16_samples_and_1_percent() -> None:
    assert interval_alert_limit(16, 0.01) == 0
    # at 5 % the point estimate alerts at 1 of 16, the interval only when confident
    assert interval_alert_limit(16, 0.05) >= 1


def test_compute_mode_alert_fires_on_the_interval_upper_bound() -> None:
    """A window of 16 at a 5 % constraint: one disagreement (6 %) fails the point
    estimate, so Apparate's rule alerts; its interval's upper bound is still above 95 %."""
    k = interval_alert_limit(16, 0.05)
    for rule, fires_at in ((False, 1), (True, k + 1)):
        c = ctl(thresholds=(0.5, 0.5), constraint=0.05, sampled_feedback=rule)
        got = []
        for i in range(16):
            got.append([x.trigger for x in c.observe(batch((1, 2), 1, seed=100 + i,
                                                           wrong=float(i < fires_at)))])
            if got[-1]:
                break
        assert got[-1] == ["alert"] and len(got) == fires_at, (rule, got)
    restored = ExitController.from_dict(json.loads(json.dumps(c.to_dict())))
    assert restored.alert_limit == k


def test_clean_windows_raise_thresholds_from_zero() -> None:
    c = ctl(slack_windows=2, tune_window=32)
    assert c.thresholds == (0.0, 0.0)
    assert c.observe(batch((1, 2), 16, seed=4)) == []
    d = c.observe(batch((1, 2), 16, seed=5))
    assert [(x.kind, x.trigger) for x in d] == [("tune", "slack")]
    assert d[0].changed and max(d[0].thresholds) > 0.1
    assert d[0].est_savings_ms > 0


def test_no_slack_tune_without_enough_samples_for_the_active_ramps() -> None:
    c = ctl(slack_windows=1, tune_window=64)  # needs >= 32 samples holding ramps 1 and 2
    d = c.observe(batch((1, 2), 16, seed=6))
    assert len(d) == 1 and not d[0].changed and "wait" in d[0].reason


def test_adjust_runs_every_128_samples() -> None:
    c = ctl()
    got: list[TunerDecision] = []
    for i in range(127):
        got += c.observe(batch((1, 2), 1, seed=100 + i))
    assert not [d for d in got if d.kind == "adjust"]
    got += c.observe(batch((1, 2), 1, seed=99))
    adj = [d for d in got if d.kind == "adjust"]
    assert len(adj) == 1 and adj[0].at_sample == 128 and adj[0].utilities
    got += c.observe(batch(c.active, 128, seed=7))  # one call spanning a whole round
    assert [d.at_sample for d in got if d.kind == "adjust"] == [128, 256]
    assert c.counts["adjusts"] == 2


def test_adjust_judges_the_last_two_rounds() -> None:
    # the re-tune keeps 0.5% headroom: 128 samples would allow no disagreement, 256 one
    c = ctl(active=(0, 1, 2, 3))  # every site: no round changes the active set
    got = c.observe(batch(c.active, 128, seed=5))
    got += c.observe(batch(c.active, 128, seed=6))
    got += c.observe(batch(c.active, 128, seed=7))
    assert [(d.at_sample, d.tuned_on) for d in got if d.kind == "adjust"] == [
        (128, 128), (256, 256), (384, 256)]
    assert ctl(adjust_window=64).adjust_window == 64


def test_records_lacking_new_ramps_are_not_used() -> None:
    c = ctl(active=(1, 2), slack_windows=None, tune_window=64)
    c.observe(batch((1,), 48, seed=8, wrong=0.3))  # served before ramp 2 was active
    assert c.recent(64) is None
    c.observe(batch((0, 1, 2), 8, seed=9))  # a superset holds both ramps: usable
    c.observe(batch((1, 2), 8, seed=10))
    w = c.recent(64)
    assert w is not None and w.ramp_ids == (1, 2) and w.n_samples == 16
    assert c.recent(64, (1,)).n_samples == 64  # ramp 1 alone: every record counts


def test_tune_after_an_added_ramp_uses_only_records_with_it() -> None:
    c = ctl(active=(2,), thresholds=(0.2,), slack_windows=None, tune_window=512)
    for i in range(128):  # ramp 2 answers well: all utilities positive -> probe earlier
        decisions = c.observe(batch((2,), 1, seed=200 + i))
    assert decisions[-1].action == "add_earlier" and c.active == (1, 2)
    c.observe(batch((1, 2), 10, seed=11))
    d = c.observe(batch((1, 2), 1, seed=12, wrong=1.0))
    assert d[0].trigger == "alert"
    assert d[0].window.ramp_ids == (1, 2) and d[0].window.n_samples == 11


def test_serialisation_round_trip_resumes_identically() -> None:
    a = ctl(slack_windows=2, tune_window=64)
    for i in range(10):
        a.observe(batch(a.active, 23, seed=300 + i, wrong=0.05))
    b = ExitController.from_dict(json.loads(json.dumps(a.to_dict())))
    assert b.to_dict() == a.to_dict()
    for i in range(10):
        x = batch(a.active, 19, seed=400 + i, wrong=0.05)
        y = ExitWindow.build(b.active, x.pred, x.score, x.final)
        assert [d.to_dict() for d in a.observe(x)] == [d.to_dict() for d in b.observe(y)]
    assert b.to_dict() == a.to_dict()


def test_deterministic() -> None:
    def run() -> list[dict]:
        c = ctl(slack_windows=2, tune_window=64)
        out = []
        for i in range(20):
            out += [d.to_dict() for d in c.observe(batch(c.active, 17, seed=i, wrong=0.04))]
        return out

    first = run()
    assert first and first == run()


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        ctl(window=0)
    with pytest.raises(ValueError):
        ctl(slack_windows=0)
    with pytest.raises(ValueError):
        ctl(active=(1, 9))
    with pytest.raises(ValueError):
        ctl(thresholds=(0.1,))


def _trials(c: ExitController, rounds: int, wrong: float, seed: int = 0) -> list[tuple[int, tuple]]:
    """(round, active set) of every adjust round over ``rounds`` windows of 128 samples."""
    out = []
    for k in range(rounds):
        for d in c.observe(batch(c.active, 128, seed=seed + k, wrong=wrong)):
            if d.kind == "adjust" or d.trigger == "adjust":
                out.append((c.rounds, tuple(d.active)))
    return out


def test_cooldown_doubles_with_each_failure_in_a_row_up_to_a_cap() -> None:
    c = ctl(cooldown_rounds=2)
    assert c.cooldown(3) == 2                     # never failed: the base wait
    for k, want in [(1, 2), (2, 4), (3, 8), (4, 16), (5, 32), (9, 32)]:
        c.failures[3] = k
        assert c.cooldown(3) == want


def test_trials_back_off_as_a_whole_when_no_ramp_pays() -> None:
    # every ramp is always wrong: each trial is dropped at the next round, whatever the site
    c = ctl(active=(1,), thresholds=(0.0,), adjust_every=128)
    trials = [r for r, active in _trials(c, 60, wrong=1.0) if active]
    gaps = np.diff(trials)
    assert len(trials) >= 4 and (np.diff(gaps) > 0).all(), trials  # 2, 6, 12, 22, 40 ...
    assert c.trial_streak >= 4 and c.failures, (c.trial_streak, c.failures)
    # the backoff survives a restart from the store
    again = ExitController.from_dict(json.loads(json.dumps(c.to_dict())))
    assert (again.failures, again.trial_streak, again.trial_hold_until, again.trials) == \
        (c.failures, c.trial_streak, c.trial_hold_until, c.trials)
    assert again.cooldown(1) == c.cooldown(1) and again.trial_cooldown() == c.trial_cooldown()


def test_trial_cooldown_doubles_with_each_failed_trial_in_a_row_up_to_a_cap() -> None:
    c = ctl(cooldown_rounds=2)
    for k, want in [(0, 2), (1, 2), (2, 4), (3, 8), (6, 32), (9, 32)]:
        c.trial_streak = k
        assert c.trial_cooldown() == want


def test_a_trial_that_pays_ends_the_streak() -> None:
    c = ctl(active=(1,), thresholds=(0.5,), adjust_every=128)
    c.trials, c.trial_streak = {1}, 3
    _trials(c, 1, wrong=0.0)  # the trialled ramp answers right, confidently: it pays
    assert 1 in c.active and c.trial_streak == 0 and 1 not in c.trials


def test_a_ramp_that_pays_its_way_starts_its_backoff_afresh() -> None:
    c = ctl(active=(1,), thresholds=(0.5,), adjust_every=128)
    c.failures[1] = 4
    _trials(c, 1, wrong=0.0)  # ramp 1 answers right, confidently: positive utility
    assert 1 in c.active and 1 not in c.failures


def test_a_refitted_head_restarts_its_ramp_at_threshold_zero() -> None:
    c = ctl(active=(1, 3), thresholds=(0.4, 0.5))
    c.observe(batch((1, 3), 40, seed=3))
    d = c.head_changed([3])
    assert (d.kind, d.action, d.changed, d.version) == ("refit", "refit", True, 1)
    assert c.thresholds == (0.4, 0.0) and d.thresholds == (0.4, 0.0)
    assert 3 in c.trials                               # judged like a trial next round
    assert c.recent(100) is None                       # nothing recorded says what head 2 does
    assert c.recent(100, (1,)).n_samples == 40         # the other ramp keeps its records
    c.observe(batch((1, 3), 16, seed=4))
    assert c.recent(100).n_samples == 16               # the new head's records count


def test_a_refit_of_an_inactive_site_clears_its_record_and_back_off() -> None:
    c = ctl(active=(1,), thresholds=(0.4,))
    c.failures[2], c.deactivated_at[2] = 3, 5
    d = c.head_changed([2])
    assert not d.changed and c.version == 0 and c.thresholds == (0.4,)
    assert 2 not in c.failures and 2 not in c.deactivated_at
    with pytest.raises(ValueError):
        c.head_changed([9])


def test_with_evidence_refitted_heads_get_their_set_and_thresholds_at_once() -> None:
    ev = {"w": None}
    c = ctl(active=(1, 3), thresholds=(0.4, 0.5), evidence=lambda: ev["w"])
    c.observe(batch((1, 3), 40, seed=3))
    ev["w"] = batch((1, 2, 3), 200, seed=5)  # every site's current head on recent inputs
    d = c.head_changed([1, 3])
    assert d.kind == "refit" and d.tuned_on == 200 and d.changed
    assert c.active and all(t > 0 for t in c.thresholds)  # no restart from 0
    assert meets(evaluate(ev["w"].select(list(c.active)), PROFILE, c.thresholds), 0.01)
    assert set(c.active) & {1, 3} <= c.trials
    ev["w"] = batch((1, 2, 3), 40, seed=5)  # too little evidence: thresholds restart at 0
    d = c.head_changed([c.active[0]])
    assert d.thresholds[0] == 0.0
