"""End-to-end fixtures: `offramp up` as a user runs it, in a subprocess, per test module.

A module sets ``MODEL`` (what `up` serves), and optionally ``STACK_ARGS`` (more `up` flags)
and ``STACK_ENV`` (more environment), and asks for the ``stack`` fixture.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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
        self.client_url = ""
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
            if line.startswith("offramp up: client URL "):
                self.client_url = line.split()[4]
            if line.startswith("offramp up: ready"):
                self.pids = json.loads(line.split("pids=", 1)[1])
                return
        self.stop()
        raise RuntimeError(f"offramp up did not become ready: {lines} {self.proc.stderr.read()}")

    async def connect(self, role: str, name: str):
        """A NATS connection as ``role``, with the credentials `up` generated."""
        from services.common import bus
        from services.common.credentials import home_file, read

        return await bus.connect(self.url, name, login=read(home_file(self.home))[role])

    def violations(self) -> list[str]:
        """Permission violations the server logged: none unless a test provoked them."""
        log = self.home / "nats" / "nats-server.log"
        return [line for line in log.read_text().splitlines() if "Violation" in line]

    def warnings(self, limit: int = 40) -> str:
        """The services' warnings and errors, for a failure message: what the router and the
        workers saw (losses, late heartbeats) is gone with the test's folder otherwise."""
        lines = [f"{log.stem}: {line}" for log in sorted((self.home / "logs").glob("*.log"))
                 for line in log.read_text(errors="replace").splitlines()
                 if " WARNING " in line or " ERROR " in line]
        return "\n".join(lines[-limit:])

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
                              capture_output=True, text=True, timeout=60, check=False)

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


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, models_dir: Path,
          tmp_path_factory: pytest.TempPathFactory):
    mod = request.module
    s = Stack(tmp_path_factory.mktemp(mod.MODEL), mod.MODEL, models_dir,
              list(getattr(mod, "STACK_ARGS", ())), env=getattr(mod, "STACK_ENV", None))
    yield s
    s.stop()
    # every service's role must allow what it does (tests that attack set ATTACKS)
    assert getattr(mod, "ATTACKS", False) or not s.violations(), s.violations()[:5]
