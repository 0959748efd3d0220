"""Read a histogram from services' ``/metrics`` (what a Prometheus server would scrape),
summed over the services: a bench's view of what the services measured themselves."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

TIMEOUT_S = 5.0


def _samples(urls: list[str], name: str, strict: bool) -> Iterator[Any]:
    """Every sample of metric family ``name`` from every service that answers; with
    ``strict``, OSError when none of ``urls`` answers."""
    answered = 0
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        answered += 1
        for family in text_string_to_metric_families(text):
            if family.name == name:
                yield from family.samples
    if strict and urls and not answered:
        raise OSError(f"no /metrics answered: {', '.join(urls)}")


def histogram_buckets(urls: list[str], name: str, labels: dict[str, str]) -> dict[float, float]:
    """Cumulative bucket counts (``le`` -> count) of histogram ``name`` with ``labels``,
    summed over ``urls``; a service that does not answer counts nothing (and is named in
    the error of the caller's summary only if no service answers at all)."""
    out: dict[float, float] = {}
    for s in _samples(urls, name, strict=True):
        if s.name == f"{name}_bucket" and all(s.labels.get(k) == v for k, v in labels.items()):
            le = float(s.labels["le"])
            out[le] = out.get(le, 0.0) + s.value
    return out


def histogram_sum_count(urls: list[str], name: str,
                        by: str) -> dict[str, tuple[float, float]]:
    """Per value of label ``by``: (sum, count) of histogram ``name``, summed over ``urls``
    (services that do not answer count nothing)."""
    out: dict[str, list[float]] = {}
    for s in _samples(urls, name, strict=False):
        key = s.labels.get(by)
        if key is None:
            continue
        acc = out.setdefault(key, [0.0, 0.0])
        if s.name == f"{name}_sum":
            acc[0] += s.value
        elif s.name == f"{name}_count":
            acc[1] += s.value
    return {k: (v[0], v[1]) for k, v in out.items()}
