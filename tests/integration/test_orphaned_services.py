"""A service started by an `offramp up` that is SIGKILLed stops by itself, cleanly, instead
of serving on as an orphan beside the next stack (services.common.service_loop)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from services.common.service_loop import run_service

    marker = Path(sys.argv[1])

    async def main(stop):
        marker.write_text("serving")
        await stop.wait()
        marker.write_text("stopped cleanly")

    run_service(main)
""")

PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    env = {**os.environ, "OFFRAMP_PARENT_PID": str(os.getpid())}
    subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env,
                     start_new_session=True)
    time.sleep(600)
""")


def _wait_for(marker: Path, text: str, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.is_file() and marker.read_text() == text:
            return True
        time.sleep(0.05)
    return False


def test_a_service_whose_up_is_killed_stops_cleanly(tmp_path):
    marker = tmp_path / "state"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(marker)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert _wait_for(marker, "serving"), "the child never started"
        time.sleep(1.0)  # several checks while the parent lives: it keeps serving
        assert marker.read_text() == "serving"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _wait_for(marker, "stopped cleanly"), "the orphaned service kept running"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_without_a_parent_pid_a_service_runs_on_its_own(tmp_path):
    """docker compose and `offramp serve` by hand set no parent: nothing watches."""
    marker = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if k != "OFFRAMP_PARENT_PID"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(marker)], cwd=ROOT,
                             env={**env, "PYTHONPATH": str(ROOT)})
    try:
        assert _wait_for(marker, "serving")
        time.sleep(1.0)
        assert child.poll() is None and marker.read_text() == "serving"
        child.send_signal(signal.SIGTERM)
        assert child.wait(20) == 0 and marker.read_text() == "stopped cleanly"
    finally:
        if child.poll() is None:
            child.kill()
