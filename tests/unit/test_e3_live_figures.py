"""The live E3 bench's arithmetic (services.bench.e3_live): figures of a phase from the
client's outcomes, and mean batch sizes from two scrapes of the workers' histograms."""

from __future__ import annotations

import pytest

from services.bench.e3_live import batch_means, phase_figures
from services.loadgen.drive import Outcome


def test_phase_figures_count_answers_within_the_slo_against_the_reference() -> None:
    outs = [Outcome(0, True, 100.0, label=3), Outcome(1, True, 300.0, label=4),
            Outcome(2, True, 900.0, label=5),            # past the 500 ms SLO: not goodput
            Outcome(3, False, 20.0, code="overloaded")]
    fig = phase_figures(outs, {0: 3, 1: 9, 2: 5, 3: 1}, 10.0, 20.0, 500.0, 2.0)
    assert fig["answered_in_slo"] == 2 and fig["goodput_rps"] == pytest.approx(0.2)
    assert fig["agreement"] == pytest.approx(0.5)  # request 1 disagrees with the full model
    assert fig["codes"] == {"ok": 3, "overloaded": 1}
    assert fig["cost"] == pytest.approx(1000.0 * 2.0 * 10.0 / 2)  # worker-s per 1,000
    assert fig["p50_ms"] == pytest.approx(200.0)


def test_batch_means_between_two_scrapes() -> None:
    before = {"0": (100.0, 10.0), "1": (5.0, 5.0)}
    after = {"0": (260.0, 20.0), "1": (5.0, 5.0), "2": (24.0, 3.0)}
    assert batch_means(before, after) == {"0": 16.0, "2": 8.0}


def test_shadow_rate_option_is_checked_and_defaults_to_the_config() -> None:
    from argparse import Namespace

    from services.bench.e3_live import shadow_rate_of
    from services.common import config

    assert shadow_rate_of(Namespace(shadow_rate=0.2)) == 0.2
    assert shadow_rate_of(Namespace()) == config.load().shadow_rate
    with pytest.raises(ValueError, match="shadow-rate"):
        shadow_rate_of(Namespace(shadow_rate=1.5))


def test_accuracy_table_reads_every_row() -> None:
    from services.bench.e3_accuracy import table

    s = {"min": 0.985, "median": 0.992, "max": 0.996}
    row = {"mix": "80/20", "shadow_rate": 0.05, "seeds": 8, "requests": 30000,
           "agreement": s, "meets": 7, "worst_window": s, "worst_window_meets": 5,
           "savings_pct": 28.4, "exited": 0.8, "shadow_cost_pct": 1.7, "alerts": 10,
           "static_agreement": s, "static_equal_savings_agreement": s}
    out = table({"model": "m", "constraint": 0.01, "window": 6000, "rows": [row, row]})
    assert out.count("| 80/20 | 5 % | 98.50–99.60 % (median 99.20) | 7/8 |") == 2
