"""Metrics ports of `offramp up`'s services: chosen from OFFRAMP_METRICS_PORT, kept in
$OFFRAMP_HOME/metrics-ports.json while the supervisor lives, and listed by `offramp status`.
(Free ports from the OS need a socket: tests/integration/test_metrics.py.)"""

from __future__ import annotations

import dataclasses
import os

import pytest

from services.cli.status import render
from services.common import config as config_mod
from services.launcher import metrics_ports
from services.launcher.supervisor import Child, Deployment, Supervisor

GONE_PID = 2**31 - 1  # above any pid_max: no such process


def test_a_base_port_gives_consecutive_ports_in_start_order():
    assert metrics_ports.assign(["router", "monitor", "worker-m-s0-r0"], 9400, "0.0.0.0") == {
        "router": 9400, "monitor": 9401, "worker-m-s0-r0": 9402}
    with pytest.raises(config_mod.ConfigError, match="65535"):
        metrics_ports.assign(["a", "b"], 65535, "127.0.0.1")


def test_urls_name_a_reachable_host():
    assert metrics_ports.url("127.0.0.1", 9400) == "http://127.0.0.1:9400/metrics"
    assert metrics_ports.url("0.0.0.0", 9400) == "http://127.0.0.1:9400/metrics"
    assert metrics_ports.url("::1", 9400) == "http://[::1]:9400/metrics"


def test_the_file_is_read_only_while_its_supervisor_lives(tmp_path):
    assert metrics_ports.read(tmp_path) is None
    metrics_ports.write(tmp_path, {"router": 9400}, "127.0.0.1")
    assert metrics_ports.read(tmp_path) == {"pid": os.getpid(), "bind": "127.0.0.1",
                                            "ports": {"router": 9400}}
    metrics_ports.write(tmp_path, {"router": 9400}, "127.0.0.1", pid=GONE_PID)
    assert metrics_ports.read(tmp_path) is None  # killed before it could remove the file
    metrics_ports.remove(tmp_path)  # not this process's file: left alone
    assert (tmp_path / metrics_ports.FILE).exists()
    (tmp_path / metrics_ports.FILE).write_text("{not json")
    assert metrics_ports.read(tmp_path) is None


def test_supervisor_gives_each_child_a_port_and_records_them(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFRAMP_METRICS_PORT", "9500")
    cfg = dataclasses.replace(config_mod.load(), home=tmp_path)
    sup = Supervisor(cfg, Deployment(("m",)))
    sup.children = [Child("router", []), Child("monitor", []), Child("worker-m-s0-r0", [])]
    sup.assign_metrics_ports()
    assert [c.metrics_port for c in sup.children] == [9500, 9501, 9502]
    assert metrics_ports.read(tmp_path)["ports"] == {"router": 9500, "monitor": 9501,
                                                     "worker-m-s0-r0": 9502}
    sup.stop()  # no child runs; the file goes with the stack
    assert metrics_ports.read(tmp_path) is None


def test_status_lists_the_metrics_urls():
    text = render({"nats": "nats://127.0.0.1:4222", "router": {"models": {}},
                   "monitor": {"models": {}},
                   "metrics": {"pid": 1, "bind": "127.0.0.1",
                               "ports": {"router": 9400, "worker-m-s0-r0": 9401}}})
    assert "metrics router: http://127.0.0.1:9400/metrics" in text
    assert "metrics worker-m-s0-r0: http://127.0.0.1:9401/metrics" in text
    assert "metrics" not in render({"nats": "x", "router": {}, "monitor": {}})


def test_metrics_settings(monkeypatch):
    monkeypatch.delenv("OFFRAMP_METRICS_PORT", raising=False)
    monkeypatch.delenv("OFFRAMP_METRICS_BIND", raising=False)
    cfg = config_mod.load()
    assert (cfg.metrics_port, cfg.metrics_bind) == (None, "127.0.0.1")
    assert "OFFRAMP_METRICS_PORT" not in cfg.as_env()
    monkeypatch.setenv("OFFRAMP_METRICS_PORT", "9400")
    monkeypatch.setenv("OFFRAMP_METRICS_BIND", "0.0.0.0")
    env = config_mod.load().as_env()
    assert (env["OFFRAMP_METRICS_PORT"], env["OFFRAMP_METRICS_BIND"]) == ("9400", "0.0.0.0")
    for bad in ("http", "-1", "70000"):
        monkeypatch.setenv("OFFRAMP_METRICS_PORT", bad)
        with pytest.raises(config_mod.ConfigError, match="OFFRAMP_METRICS_PORT"):
            config_mod.load()
