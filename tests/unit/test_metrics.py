"""Metric definitions (services/common/metrics.py): Prometheus naming, the bulk histogram
against prometheus_client's own, cached label children, and the router's per-flush counts."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

from schemas.telemetry import OK, RequestRecord
from services.common import metrics
from services.common.bulk_histogram import BulkHistogram


def defined() -> dict[str, object]:
    """Every metric the module defines, by attribute name."""
    kinds = (Counter, Gauge, Histogram, BulkHistogram)
    return {k: v for k, v in vars(metrics).items() if isinstance(v, kinds)}


def family_name(metric) -> str:
    return metric.describe()[0].name


def samples(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_names_follow_prometheus_conventions():
    names = {k: family_name(m) for k, m in defined().items()}
    assert len(set(names.values())) == len(names) >= 15
    for attr, name in names.items():
        m = defined()[attr]
        assert name.startswith("offramp_"), name
        assert not name.endswith("_total"), name  # the client adds it to counters
        if isinstance(m, (Histogram, BulkHistogram)) and not name.endswith(("_size", "_ratio")):
            assert name.endswith("_seconds"), f"{name}: durations in base units"
        assert "_ms" not in name and "millis" not in name, name


def test_every_metric_is_in_the_default_registry():
    exposed = {f.name for f in REGISTRY.collect()}
    assert {family_name(m) for m in defined().values()} <= exposed


def test_bulk_histogram_exposes_what_a_histogram_would():
    values_ms = [0.2, 0.5, 1.0, 3.0, 7.5, 7.5000001, 80.0, 4000.0, 9000.0]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    bulk = BulkHistogram("x_seconds", "doc", ["model"], metrics.SECONDS, registry=ours)
    plain = Histogram("x_seconds", "doc", ["model"], buckets=metrics.SECONDS, registry=theirs)
    bulk.labels("m").observe_many(values_ms[:4], scale=1e-3)
    bulk.labels("m").observe_many(np.array(values_ms[4:]) * 1e-3)
    bulk.labels("m").observe_many([])
    for v in values_ms:
        plain.labels("m").observe(v * 1e-3)
    got, want = samples(generate_latest(ours).decode()), samples(generate_latest(theirs).decode())
    assert set(got) == {k for k in want if not k[0].endswith("_created")}
    for key, value in got.items():
        assert value == pytest.approx(want[key]), key
    # a value on a bound counts in that bound's bucket ("le")
    assert got[("x_seconds_bucket", (("le", "0.0075"), ("model", "m")))] == 5
    assert got[("x_seconds_count", (("model", "m"),))] == len(values_ms)


def test_bulk_histogram_checks_its_labels():
    h = BulkHistogram("y_seconds", "doc", ["model", "stage"], (0.1, 1), registry=None)
    with pytest.raises(ValueError, match="labels"):
        h.labels("m")
    assert h.labels("m", 0) is h.labels("m", "0")


def test_children_are_made_once_per_key():
    registry = CollectorRegistry()
    c = Counter("z", "doc", ["model", "code"], registry=registry)
    kids = metrics.Children(c, "m")
    kids["ok"].inc(2)
    kids["ok"].inc()
    kids["overloaded"].inc()
    assert kids["ok"] is kids["ok"] and len(kids) == 2
    assert registry.get_sample_value("z_total", {"model": "m", "code": "ok"}) == 3


def test_serve_without_a_port_serves_nothing():
    assert metrics.serve(None) is None


def test_router_counts_a_flush_of_records():
    from services.router.service import ModelMetrics

    model = "unit-metrics-model"
    m = ModelMetrics(model)
    records = [RequestRecord("a", 0.0, 2.0, OK, 0, True, 1, 3),
               RequestRecord("b", 0.0, 4.0, OK, -1, False, 1, 3),
               RequestRecord("c", 0.0, 6.0, OK, 0, True, 2, 3),
               RequestRecord("d", 0.0, 0.1, "overloaded")]
    m.count(records, [[1.0, 2.0], [0.5]], queued=7)
    m.count([], [], queued=0)

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, {"model": model, **labels})

    assert value("offramp_requests_total", code="ok") == 3
    assert value("offramp_requests_total", code="overloaded") == 1
    assert value("offramp_exits_total", ramp="0") == 2
    assert value("offramp_exits_total", ramp="final") == 1
    assert value("offramp_request_duration_seconds_count") == 3  # ok answers only
    assert value("offramp_request_duration_seconds_sum") == pytest.approx(0.012)
    assert value("offramp_queue_duration_seconds_count") == 3
    assert value("offramp_queued_requests") == 0
