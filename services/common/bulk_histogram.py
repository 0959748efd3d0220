"""A Prometheus histogram fed many observations at once.

The router learns each request's latency on its hot path but keeps the values anyway (its
request records); ``prometheus_client``'s ``Histogram.observe`` takes a lock and scans the
buckets per value, about 1 µs each, which at thousands of requests per second would stall
the event loop in every record flush. Here a flush hands over all its values in one call:
numpy bins them and one lock covers the whole update. Scrapes read the same exposition
format as a ``Histogram``'s (cumulative ``_bucket``, ``_count``, ``_sum``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.registry import REGISTRY, CollectorRegistry
from prometheus_client.utils import floatToGoString


class BulkSeries:
    """One label set of a :class:`BulkHistogram`."""

    def __init__(self, bounds: np.ndarray, lock: threading.Lock) -> None:
        self.bounds = bounds
        self.lock = lock  # shared with the family: a scrape reads every series consistently
        self.counts = np.zeros(len(bounds) + 1, np.int64)  # per bucket, the last is +Inf
        self.sum = 0.0

    def observe_many(self, values: Sequence[float] | np.ndarray, scale: float = 1.0) -> None:
        """Add ``values`` (times ``scale``, e.g. 1e-3 for milliseconds to seconds)."""
        v = np.asarray(values, np.float64)
        if v.size == 0:
            return
        if scale != 1.0:
            v = v * scale
        # a value equal to a bound belongs to that bound's bucket (Prometheus "le")
        per_bucket = np.bincount(np.searchsorted(self.bounds, v, side="left"),
                                 minlength=len(self.counts))
        total = float(v.sum())
        with self.lock:
            self.counts += per_bucket
            self.sum += total

    def observe(self, value: float) -> None:
        self.observe_many((value,))


class BulkHistogram:
    """A labelled histogram (a registry collector) whose series take values in bulk."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Iterable[float], registry: CollectorRegistry | None = REGISTRY) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = np.array(sorted(float(b) for b in buckets if b != float("inf")))
        self.lock = threading.Lock()
        self.series: dict[tuple[str, ...], BulkSeries] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: object) -> BulkSeries:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        with self.lock:
            series = self.series.get(key)
            if series is None:
                series = self.series[key] = BulkSeries(self.bounds, self.lock)
        return series

    def describe(self) -> list[HistogramMetricFamily]:
        # lets the registry check names without collecting
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> list[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        with self.lock:
            snapshot = [(key, s.counts.cumsum(), s.sum) for key, s in self.series.items()]
        for key, cumulative, total in snapshot:
            family.add_metric(list(key), list(zip(les, cumulative.tolist(), strict=True)), total)
        return [family]
