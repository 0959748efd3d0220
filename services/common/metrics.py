"""Prometheus metrics of every offramp service: all the definitions, in one place so names
and labels stay consistent (docs/architecture.md lists them), and :func:`serve`, which
exposes a process's metrics over HTTP.

Each process registers every family but only the service that owns one updates it; a
family without samples costs a scrape two comment lines. Hot paths keep the children of
their label sets (:class:`Children`) instead of calling ``labels()`` per request, and the
router hands latencies over per flush (``BulkHistogram``).
"""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

from services.common.bulk_histogram import BulkHistogram

# One series per counter instead of two: Prometheus derives the start from the counter's
# resets, so the ``_created`` companions only double what every scrape carries.
disable_created_metrics()

SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5,
           1.0, 2.5, 5.0)
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
FINAL = "final"  # the ramp label of answers from the full model

# router: every request it admitted or refused for a served model, once answered
REQUESTS = Counter("offramp_requests", "Requests answered, by model and reply code "
                   "(ok, or the error code the client got)", ["model", "code"])
REQUEST_SECONDS = BulkHistogram("offramp_request_duration_seconds", "Time from admission to "
                                "the answer, of requests answered ok", ["model"], SECONDS)
QUEUE_SECONDS = BulkHistogram("offramp_queue_duration_seconds", "Time a request waited in the "
                              "router's queue before each dispatch", ["model"], SECONDS)
EXITS = Counter("offramp_exits", "Requests answered ok, by the ramp that answered "
                f"({FINAL}: the full model)", ["model", "ramp"])
QUEUED = Gauge("offramp_queued_requests", "Requests waiting in the router's queue", ["model"])
# hint / drain: 1 is exact, 2 twice too long; bounds at 0.5 and 2 count "within 2x"
HINT_RATIOS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.11, 1.25, 1.5, 2.0, 4.0, 8.0)
RETRY_HINT_RATIO = BulkHistogram("offramp_retry_hint_ratio", "retry_after_ms of an overloaded "
                                 "reply over the time the queue it met took to drain (until "
                                 "its tail was answered)", ["model"], HINT_RATIOS)

# worker: per stage it runs
STAGE_SECONDS = Histogram("offramp_stage_duration_seconds", "Compute time of one batch in "
                          "one stage (blocks and ramps)", ["model", "stage"], buckets=SECONDS)
BATCH_SIZE = Histogram("offramp_batch_size", "Samples per batch a stage ran",
                       ["model", "stage"], buckets=BATCH_SIZES)
WORKER_CREDIT = Gauge("offramp_worker_credit", "Batches a worker may hold at once",
                      ["model", "stage"])
WORKER_INFLIGHT = Gauge("offramp_worker_inflight_batches", "Batches a worker holds now "
                        "(queued and running)", ["model", "stage"])
EXIT_CONFIG_VERSION = Gauge("offramp_exit_config_version", "Version of the exit config a "
                            "worker applies", ["model"])
EXIT_GUARD_CAPS = Counter("offramp_exit_guard_caps", "Ramp thresholds a worker capped itself "
                          "after a wrong early answer, until the next exit config", ["model"])

# monitor: its latest closed window per model
AGREEMENT = Gauge("offramp_window_agreement", "Agreement of the answers with the final "
                  "model in the monitor's latest window (0 to 1)", ["model"])
EXIT_RATE = Gauge("offramp_window_exit_rate", "Share of samples that exited early in the "
                  "monitor's latest window", ["model"])
WINDOWS = Counter("offramp_monitor_windows", "Monitor windows closed and stored", ["model"])

# tuner
TUNER_CONFIGS = Counter("offramp_tuner_configs", "Exit configs the tuner deployed, by what "
                        "triggered them", ["model", "trigger"])
TUNER_DECISION_SECONDS = Histogram("offramp_tuner_decision_seconds", "Time the controller "
                                   "took to take in one telemetry message and decide",
                                   ["model"], buckets=SECONDS)

# profiler
PROFILES = Counter("offramp_profiles", "Latency profiles stored (measured, or taken from the "
                   "preparation) or failed", ["model", "result"])

# every service
RESTARTS = Counter("offramp_background_restarts", "Restarts of a background loop after it "
                   "failed (services/common/service_loop.py)", ["loop"])

log = logging.getLogger("offramp.metrics")


class Children(dict):
    """``metric.labels(*fixed, key)`` per key, made once: ``labels()`` takes a lock and
    builds a tuple per call, which the hot paths do not pay per batch."""

    def __init__(self, metric, *fixed: str) -> None:
        super().__init__()
        self.metric = metric
        self.fixed = fixed

    def __missing__(self, key):
        child = self[key] = self.metric.labels(*self.fixed, str(key))
        return child


def serve(port: int | None, bind: str = "127.0.0.1") -> int | None:
    """Serve this process's metrics at ``http://bind:port/metrics`` from a daemon thread
    (port None: metrics stay off); the port it listens on (0 asks the OS for one), or None.
    A port it cannot take is logged and the service goes on without metrics: serving
    matters more than being observed."""
    if port is None:
        return None
    try:
        server, _ = start_http_server(port, addr=bind)
    except OSError as exc:
        log.error("metrics not served on %s:%s: %s", bind, port, exc)
        return None
    return int(server.server_port)
