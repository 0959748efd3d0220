"""Prometheus metrics of a running stack: `offramp up` (in a subprocess, as a user runs it)
serves `tiny` in two stages with the tuner, so router, monitor, profiler, tuner and two
workers each serve /metrics on a port of their own; requests go through the public
contract, and every service's /metrics is parsed as Prometheus would and must count them."""

from __future__ import annotations

import asyncio
import logging
import socket
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common import metrics
from services.common.client import InferError, infer
from services.launcher import metrics_ports
from services.loadgen.drive import drive
from tests.e2e.conftest import Stack, wait_for

MODEL = "tiny"
N_OK = 48
N_BAD = 3
WORKERS = ("worker-tiny-s0-r0", "worker-tiny-s1-r0")
SERVICES = {"router", "monitor", "profiler", "tuner", *WORKERS}


@pytest.fixture(scope="module")
def stack(models_dir, tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("metrics"), MODEL, models_dir,
              ["--split", "tiny=2", "--adapt"])
    yield s
    s.stop()


async def send(stack: Stack) -> tuple[int, list[str]]:
    """N_OK good requests and N_BAD malformed ones: (answered ok, error codes)."""
    rng = np.random.default_rng(0)
    nc = await stack.connect("client", "metrics-test")
    try:
        inputs = [{"x": rng.standard_normal(16).astype(np.float32)} for _ in range(N_OK)]
        outcomes = await drive(nc, MODEL, inputs, concurrency=4, slo_ms=5000)
        codes = []
        for _ in range(N_BAD):
            try:
                await infer(nc, MODEL, {"x": np.zeros(17, np.float32)}, 5000, timeout=5)
            except InferError as exc:
                codes.append(exc.code)
    finally:
        await nc.close()
    return sum(o.ok for o in outcomes), codes


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def total(families: dict, family: str, sample: str, **labels) -> float | None:
    """Sum of ``sample`` over the series of ``family`` that carry ``labels``; None when the
    family has no such series."""
    values = [s.value for s in families.get(family, ()).samples if s.name == sample
              and all(s.labels.get(k) == str(v) for k, v in labels.items())] \
        if family in families else []
    return sum(values) if values else None


def test_every_service_counts_what_it_served(stack):
    listed = metrics_ports.read(stack.home)
    assert listed is not None and set(listed["ports"]) == SERVICES
    ports = listed["ports"]
    assert len(set(ports.values())) == len(ports)
    assert asyncio.run(send(stack)) == (N_OK, ["bad_request"] * N_BAD)

    # router: counted once per record flush (every 0.25 s); the good and the bad requests
    # may fall in different flushes
    def router_counted():
        f = scrape(ports["router"])
        done = [total(f, "offramp_requests", "offramp_requests_total", model=MODEL, code=c)
                for c in ("ok", "bad_request")]
        return f if done == [N_OK, N_BAD] else None

    router = wait_for(router_counted, timeout=20)
    assert router, scrape(ports["router"]).get("offramp_requests")
    assert total(router, "offramp_requests", "offramp_requests_total", model=MODEL,
                 code="bad_request") == N_BAD
    assert total(router, "offramp_exits", "offramp_exits_total", model=MODEL) == N_OK
    assert total(router, "offramp_request_duration_seconds",
                 "offramp_request_duration_seconds_count", model=MODEL) == N_OK
    assert total(router, "offramp_queue_duration_seconds",
                 "offramp_queue_duration_seconds_count", model=MODEL) >= N_OK
    assert router["offramp_request_duration_seconds"].type == "histogram"

    for name in WORKERS:
        stage = name.split("-s")[1][0]
        w = scrape(ports[name])
        # every request ran through both stages once (latency mode: exits keep running)
        assert total(w, "offramp_batch_size", "offramp_batch_size_sum", model=MODEL,
                     stage=stage) == N_OK, name
        assert total(w, "offramp_stage_duration_seconds", "offramp_stage_duration_seconds_count",
                     model=MODEL, stage=stage) >= 1, name
        assert total(w, "offramp_worker_credit", "offramp_worker_credit", model=MODEL,
                     stage=stage) == 2  # OFFRAMP_WORKER_CREDIT's default
        assert total(w, "offramp_worker_inflight_batches", "offramp_worker_inflight_batches",
                     model=MODEL, stage=stage) is not None
        assert total(w, "offramp_exit_config_version", "offramp_exit_config_version",
                     model=MODEL) >= 1

    monitor = wait_for(lambda: (f := scrape(ports["monitor"])) and total(
        f, "offramp_monitor_windows", "offramp_monitor_windows_total", model=MODEL) and f)
    assert 0.0 <= total(monitor, "offramp_window_agreement", "offramp_window_agreement",
                        model=MODEL) <= 1.0
    tuner = wait_for(lambda: (f := scrape(ports["tuner"])) and total(
        f, "offramp_tuner_decision_seconds", "offramp_tuner_decision_seconds_count",
        model=MODEL) and f, 60)  # its first telemetry comes late on a loaded machine
    assert tuner, "the tuner took in no telemetry"
    profiler = wait_for(lambda: (f := scrape(ports["profiler"])) and total(
        f, "offramp_profiles", "offramp_profiles_total", model=MODEL, result="failed") is None
        and total(f, "offramp_profiles", "offramp_profiles_total", model=MODEL) and f, 60)
    assert profiler, "the profiler stored no profile of tiny"

    for name, port in ports.items():  # what every service exposes
        f = scrape(port)
        assert f["offramp_background_restarts"].type == "counter", name
        assert "process_cpu_seconds" in f, name


def test_status_lists_every_metrics_port(stack):
    ports = metrics_ports.read(stack.home)["ports"]
    out = stack.cli("status")
    assert out.returncode == 0, out.stderr
    for name, port in ports.items():
        assert f"metrics {name}: http://127.0.0.1:{port}/metrics" in out.stdout


def test_a_taken_port_leaves_the_service_running_without_metrics(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with caplog.at_level(logging.ERROR, "offramp.metrics"):
            assert metrics.serve(taken.getsockname()[1]) is None
    assert "metrics not served" in caplog.text


def test_free_ports_are_distinct_and_free():
    ports = metrics_ports.assign(["a", "b", "c"], None, "127.0.0.1")
    assert len(set(ports.values())) == 3
    for port in ports.values():
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
