"""`offramp bench overhead` runs live end to end and writes the documented JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO

pytestmark = pytest.mark.e2e


def test_bench_overhead_writes_the_documented_figures(models_dir, tmp_path):
    out = tmp_path / "overhead.json"
    env = {**os.environ, "OFFRAMP_HOME": str(tmp_path / "home"),
           "OFFRAMP_MODELS_DIR": str(models_dir)}
    env.pop("OFFRAMP_NATS_URL", None)
    env.pop("OFFRAMP_DATABASE_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "overhead", "--model", "tiny",
         "--requests", "30", "--duration", "0.5", "--concurrency", "8", "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "live"
    for key in ("inprocess_p50_ms", "pipeline_p50_ms", "pipeline_p99_ms", "sustained_rps",
                "transport_floor_p50_ms"):
        assert result[key] > 0, key
    assert result["overhead_p50_ms"] == pytest.approx(
        result["pipeline_p50_ms"] - result["inprocess_p50_ms"])
    assert result["sustained_errors"] == 0
    assert "sustained" in proc.stdout and "JSON written" in proc.stdout
