"""`offramp bench superserve` live on the tiny supernet: each policy asked for gets its own
stack, serves the same bursty traces, and the JSON holds attainment and accuracy per
policy and trace, with the subnets each policy used."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import SUPERNET_TINY
from tests.e2e.conftest import REPO

pytestmark = pytest.mark.e2e


def bench_live(models_dir, tmp_path, *args: str) -> dict:
    """Run `offramp bench superserve ARGS --json OUT` on a private home and models folder;
    its JSON."""
    out = tmp_path / "live.json"
    env = {**os.environ, "OFFRAMP_HOME": str(tmp_path / "home"),
           "OFFRAMP_MODELS_DIR": str(models_dir)}
    env.pop("OFFRAMP_NATS_URL", None)
    env.pop("OFFRAMP_DATABASE_URL", None)
    proc = subprocess.run([sys.executable, "-m", "services.cli", "bench", "superserve", *args,
                           "--json", str(out)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_live_bench_serves_every_policy(supernet_dir, tmp_path):
    doc = bench_live(supernet_dir, tmp_path, "--model", SUPERNET_TINY, "--seconds", "2",
                     "--slo-ms", "2000", "--policies", "slackfit,clipper+ most")
    assert doc["mode"] == "live" and doc["model"] == SUPERNET_TINY
    served = {r["subnet"] for r in doc["frontier"]}
    assert "slackfit" in doc["results"] and "maxacc" not in doc["results"]
    assert [p for p in doc["results"] if p.startswith("clipper+")] == [
        f"clipper+ most accurate ({100 * doc['frontier'][-1]['agreement']:.2f})"]
    for policy, per in doc["results"].items():
        assert set(per) == set(doc["traces"])
        for trace, fig in per.items():
            assert fig["requests"] == doc["traces"][trace]
            assert fig["attainment"] > 0.9, (policy, trace, fig)
            assert set(fig["variants"]) <= served
            assert doc[policy][trace]["attainment"] == fig["attainment"]
    fixed = [p for p in doc["results"] if p.startswith("clipper+")]
    assert all(len(doc["results"][p][t]["variants"]) == 1 for p in fixed for t in doc["traces"])


def test_live_bench_serves_an_early_exit_model_by_depth_cap(models_dir, tmp_path):
    """The tiny early-exit model in compute mode: its depth caps are the variants, and
    each answer is scored against the full model's on the same input."""
    doc = bench_live(models_dir, tmp_path, "--model", "tiny", "--seconds", "2", "--slo-ms",
                     "2000", "--rate", "100", "--policies", "slackfit,clipper+ most",
                     "--faults", "--plot", str(tmp_path / "faults.svg"))
    assert doc["variants"] == "depth caps (compute mode)"
    assert doc["caps"] == [0, 1, 2]  # the tiny model's three ramps, spread as the lever's
    assert all(r["subnet"].startswith("depth<=") for r in doc["frontier"])
    assert doc["frontier"][-1]["subnet"] == "depth<=final"
    for policy, per in doc["results"].items():
        for trace in doc["traces"]:
            fig = per[trace]
            assert fig["requests"] == doc["traces"][trace]
            assert fig["attainment"] > 0.9, (policy, trace, fig)
            assert all(v.startswith("depth<=") for v in fig["variants"])
    (fixed,) = [p for p in doc["results"] if p.startswith("clipper+")]
    for trace in doc["traces"]:  # the full model answers as itself
        fig = doc["results"][fixed][trace]
        assert fig["variants"] == {"depth<=final": fig["requests"]}
        assert fig["accuracy"] >= 0.99
    # workers killed mid-trace: each policy lost both workers in turn, they came back, and
    # every request of the trace was answered or refused, none lost
    for per in doc["results"].values():
        fig = per["faults"]
        assert fig["requests"] == doc["faults"]["requests"]
        assert [k["worker"] for k in fig["kills"]] == ["worker-tiny-s0-r0", "worker-tiny-s0-r1"]
        assert all(k["pid"] and k["back_after_s"] is not None for k in fig["kills"])
        assert sum(fig["timeline"]["requests"]) == fig["requests"]
    assert (tmp_path / "faults.svg").read_text().startswith("<svg")


def test_live_bench_serves_efficientnet_at_a_fixed_depth_cap(models_dir, tmp_path):
    """A real early-exit model through the stack at its shallowest depth cap: every answer
    names that cap, scored against the full model on the same frames."""
    doc = bench_live(models_dir, tmp_path, "--model", "efficientnet-lite0", "--seconds", "2",
                     "--slo-ms", "5000", "--rate", "20", "--policies", "clipper+ fastest")
    cap = doc["frontier"][0]["subnet"]
    assert cap.startswith("depth<=") and cap != "depth<=final"
    (policy,) = doc["results"]
    for trace, fig in doc["results"][policy].items():
        assert fig["requests"] == doc["traces"][trace]
        assert fig["variants"] == {cap: fig["requests"]}, fig
        assert fig["accuracy"] is not None and fig["attainment"] > 0.9
