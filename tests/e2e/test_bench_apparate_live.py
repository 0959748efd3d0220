"""`offramp bench apparate --live` runs vanilla, static and offramp through the embedded
stack on the same stream and writes the documented JSON; bad arguments fail fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO

pytestmark = pytest.mark.e2e


def _bench(tmp_path, models_dir, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OFFRAMP_HOME": str(tmp_path / "home"),
           "OFFRAMP_MODELS_DIR": str(models_dir)}
    env.pop("OFFRAMP_NATS_URL", None)
    env.pop("OFFRAMP_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "services.cli", "bench", "apparate", *args],
                          check=False, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


def test_live_bench_runs_every_policy_on_the_same_stream(models_dir, tmp_path):
    out = tmp_path / "live.json"
    # A budget that admits ramps here, so the offramp run has something to tune.
    proc = _bench(tmp_path, models_dir, "--live", "--model", "efficientnet-lite0",
                  "--workload", "video", "--requests", "120", "--arrivals", "poisson:25",
                  "--budget", "0.25", "--grid-rounds", "2", "--repeat", "2", "--json", str(out),
                  "--plot", str(tmp_path / "live.svg"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "live" and doc["requests"] == 120 and doc["repeats"] == 2
    for name in ("vanilla", "static", "offramp", "oracle"):
        for key in ("p25_ms", "p50_ms", "p95_ms", "agreement"):
            assert doc[name][key] is not None, (name, key)
        assert doc[name]["p25_ms"] <= doc[name]["p50_ms"] <= doc[name]["p95_ms"]
        assert len(doc[name]["p50_change_by_run"]) == 2
    for name in ("vanilla", "static", "offramp"):
        assert doc[name]["ok"] == 240 and doc[name]["errors"] == 0, name
    assert doc["vanilla"]["agreement"] == 1.0 and doc["vanilla"]["exit_rate"] == 0.0
    # static serves every ramp; each offramp run starts from the initial deployment
    assert doc["offramp"]["initial_active"], doc["offramp"]
    for run in doc["runs"]:
        assert run["vanilla"]["exit_rate"] == 0.0 and run["vanilla"]["errors"] == 0
        off = run["offramp"]
        assert off["active_ramps_over_time"][0] == [0, len(off["initial_active"])]
        assert off["configs"] >= 1 and off["timeline"][0]["reason"].endswith("initial deployment")
    assert 0.0 <= doc["static"]["threshold"] <= 1.0
    assert "estimated" in doc["oracle"]["source"] and "replay" in doc["tuning_source"]
    assert "tuning_ms_p50" in doc and "grid_gap" in doc
    assert doc["answer_changes"]["pairs"] == 119 and 0 <= doc["answer_changes"]["changes"] <= 119
    assert "stream: the full model's answer changes between consecutive samples" in proc.stdout
    assert "run by run" in proc.stdout and "oracle" in proc.stdout
    svg = (tmp_path / "live.svg").read_text()
    assert svg.startswith("<svg") and "live, the last of 2 runs" in svg and "offramp" in svg


@pytest.mark.parametrize("args, message", [
    (["--live", "--json", "x.json"], "--workload"),
    (["--live", "--workload", "video", "--trace", "t.npz", "--json", "x.json"], "not both"),
    (["--live", "--workload", "video", "--requests", "0", "--json", "x.json"],
     "argument --requests: must be >= 1"),
    (["--live", "--workload", "video", "--repeat", "0", "--json", "x.json"], "positive"),
    (["--json", "x.json"], "--trace FILE"),
    (["--live", "--workload", "video", "--json", "x.json", "--plot", "p.png"], "use .svg"),
])
def test_bad_arguments_fail_before_starting_anything(tmp_path, models_dir, args, message):
    proc = _bench(tmp_path, models_dir, *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "home").exists()  # nothing was started or prepared
