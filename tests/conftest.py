"""Shared fixtures: prepared zoo models and a real `offramp up` stack in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Where dev.sh prepared the zoo: the same default as services.common.config.
MODELS_DIR = Path(os.environ.get("OFFRAMP_MODELS_DIR")
                  or Path(os.environ.get("OFFRAMP_HOME") or Path.home() / ".offramp") / "models")


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """Zoo models prepared once (idempotent: reuses artifacts by hash; dev.sh prepares them)."""
    from services.models.prepare import prepare

    for name in ("tiny", "efficientnet-lite0"):
        prepare(name, MODELS_DIR, log=lambda m: None)
    return MODELS_DIR


@pytest.fixture(scope="session")
def zoo_dir(models_dir) -> Path:
    """Every zoo model prepared (dev.sh prepares them all; idempotent)."""
    from services.models.prepare import ZOO, prepare

    for name in ZOO:
        prepare(name, MODELS_DIR, log=lambda m: None)
    return MODELS_DIR


class Stack:
    """`offramp up` as a user runs it, with its own state folder and NATS server."""

    def __init__(self, home: Path, models: str, models_dir: Path, extra_args=(), env=None) -> None:
        self.home = home
        self.env = {**os.environ, "OFFRAMP_HOME": str(home), "OFFRAMP_MODELS_DIR": str(models_dir),
                    "OFFRAMP_LOG_LEVEL": "INFO", **(env or {})}
        self.env.pop("OFFRAMP_NATS_URL", None)
        self.env.pop("OFFRAMP_DATABASE_URL", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "up", "--models", models,
             "--log-dir", str(home / "logs"), *extra_args],
            cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self.url = ""
        self.pids: dict[str, int] = {}
        deadline = time.monotonic() + 240
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("offramp up: NATS at "):
                self.url = line.split()[4]
            if line.startswith("offramp up: ready"):
                self.pids = json.loads(line.split("pids=", 1)[1])
                return
        self.stop()
        raise RuntimeError(f"offramp up did not become ready: {lines} {self.proc.stderr.read()}")

    @property
    def db_path(self) -> Path:
        return self.home / "offramp.db"

    def sql(self, query: str, *params):
        import sqlite3

        with sqlite3.connect(self.db_path, timeout=30) as conn:
            return conn.execute(query, params).fetchall()

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=REPO,
                              env={**self.env, "OFFRAMP_NATS_URL": self.url},
                              capture_output=True, text=True, timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()
