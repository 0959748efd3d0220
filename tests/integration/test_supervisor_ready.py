"""`offramp up` is ready only once every service it started says it serves (real child
processes, no bus)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from services.common import config as config_mod
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
