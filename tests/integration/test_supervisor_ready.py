"""`offramp up` is ready only once every service it started says it serves (real child
processes, no bus)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.common import config as config_mod
from services.common.readiness import READY_FILE_ENV, await_ready, is_ready
from services.launcher.supervisor import Child, Deployment, Supervisor

REPO = Path(__file__).resolve().parents[2]


def test_supervisor_waits_for_the_child_that_has_not_subscribed(tmp_path):
    cfg = dataclasses.replace(config_mod.load(), home=tmp_path)
    sup = Supervisor(cfg, Deployment(("m",)))
    sup.env = {**os.environ, "PYTHONPATH": str(REPO)}
    serving = "from services.common.readiness import mark_ready; mark_ready(); import time; time.sleep(60)"
    starting = "import time; time.sleep(60)"  # still loading: never says it serves
    sup.children = [Child("tuner", [sys.executable, "-c", serving]),
                    Child("monitor", [sys.executable, "-c", starting]),
                    Child("profiler", [sys.executable, "-c", serving])]
    (tmp_path / "ready").mkdir()
    (tmp_path / "ready" / "monitor").write_text("1\n")  # left by an earlier stack
    try:
        for child in sup.children:
            sup._spawn(child)
        deadline = time.monotonic() + 30
        while sup.not_ready() != ["monitor"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sup.not_ready() == ["monitor"]
    finally:
        sup.stop()


def test_await_ready_returns_once_marked_and_raises_when_the_process_dies(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), READY_FILE_ENV: str(tmp_path / "tuner")}
    serving = "from services.common.readiness import mark_ready; mark_ready(); import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", serving], env=env)
    try:
        await_ready(tmp_path / "tuner", proc, 30)
        assert is_ready(tmp_path / "tuner", proc.pid)
    finally:
        proc.kill()
        proc.wait()
    crashing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], env=env)
    with pytest.raises(RuntimeError, match="exited with code 3 before it was ready"):
        await_ready(tmp_path / "tuner", crashing, 30)


def test_waiting_for_ready_ends_when_the_stack_is_told_to_stop(tmp_path):
    from services.launcher.natsserver import EmbeddedNats

    cfg = dataclasses.replace(config_mod.load(), home=tmp_path)
    with EmbeddedNats(tmp_path / "nats") as server:
        sup = Supervisor(cfg, Deployment(("m",)))
        sup.url = server.url  # no router ever answers: without a stop this waits 60 s
        calls = []  # stopped() is asked on every round; it says stop on the fourth
        assert sup.wait_ready(60, stopped=lambda: calls.append(1) or len(calls) > 3) is False
        assert len(calls) == 4
