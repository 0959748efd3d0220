"""`offramp bench superserve --sim`: every policy on every trace, the JSON keys the issue
names, decision times, and the supernet's measured memory and actuation."""

from __future__ import annotations

import argparse
import itertools
import json

import pytest

from services.bench.superserve import (
    a40_variants,
    checks,
    fault_schedule,
    policies,
    run_superserve,
    traces,
)
from tests.conftest import SUPERNET_TINY


def test_policies_span_the_frontier_and_traces_scale_with_capacity():
    pols = policies(a40_variants())
    assert {"slackfit", "maxacc", "maxbatch", "infaas"} <= set(pols)
    assert sum(p.startswith("clipper+") for p in pols) == 6
    tr = traces(1000.0, 30.0)
    assert tr["bursty 1K cv2=8"][0] == "bursty:250:variant=750,cv2=8"
    assert tr["faults bursty 0.9K cv2=2"][1] and not tr["maf 0.9K"][1]
    assert fault_schedule(8, 60.0) == [(12.0, 7), (24.0, 6), (36.0, 5), (48.0, 4)]


def test_checks_compare_slackfit_with_fixed_variants_at_its_attainment():
    res = {"slackfit": {"bursty a": {"attainment": 0.9999, "accuracy": 0.79}},
           "infaas": {"bursty a": {"attainment": 1.0, "accuracy": 0.74}},
           "clipper+ 80.00": {"bursty a": {"attainment": 0.5, "accuracy": 0.80}},
           "clipper+ 77.00": {"bursty a": {"attainment": 1.0, "accuracy": 0.77}}}
    got = checks(res)["bursty a"]
    assert round(got["gain_vs_best_fixed_points"], 6) == 2.0
    assert round(got["gain_vs_infaas_points"], 6) == 5.0


def test_sim_bench_writes_the_named_keys(supernet_dir, tmp_path):
    out = tmp_path / "ss.json"
    args = argparse.Namespace(sim=True, workers=1, seconds=1.0, seed=0, slo_ms=None,
                              json=str(out), plot=str(tmp_path / "ss.svg"),
                              profile=str(supernet_dir / SUPERNET_TINY / "manifest.json"))
    assert run_superserve(args) == 0
    doc = json.loads(out.read_text())
    assert doc["mode"] == "replay simulation"
    assert next(c["device_class"] for c in doc["classes"]) == "a40-modeled"
    assert doc["classes"][0]["modeled"] and not doc["classes"][1]["modeled"]
    for policy in ("slackfit", "maxacc", "maxbatch", "infaas"):
        for r in doc[policy].values():
            assert set(r) == {"attainment", "accuracy"} and 0 <= r["attainment"] <= 1
    assert doc["decision_us_p99"] > 0
    assert doc["actuation_ms"]["in_place"] < doc["actuation_ms"]["load"]
    assert doc["supernet"]["memory_ratio"] > 1
    svg = (tmp_path / "ss.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<polyline") >= 4 and "SLO attainment" in svg
    tl = doc["classes"][0]["slackfit_timeline"]["bursty 1K cv2=8"]
    assert set(tl) == {"t", "rate", "attainment", "accuracy", "batch"}
    # live needs a prepared model: an unknown one is refused with a clear error
    assert run_superserve(argparse.Namespace(sim=False, model="no-such-model",
                                             json=str(out))) == 2


def test_exit_depths_of_an_early_exit_model_are_variants(models_dir):
    from services.bench.superserve import depth_variants
    from services.runtime.manifest import Manifest

    m = Manifest.load(models_dir / "efficientnet-lite0")
    vs = depth_variants(m)
    assert [v.key for v in vs] == [f"depth<={r.index}" for r in m.ramps] + ["depth<=final"]
    assert vs[-1].accuracy == 1.0
    assert vs[-1].latency(16) == float(m.meta["unsplit_by_batch"]["16"])
    # a deeper cut costs more at every batch size
    for a, b in itertools.pairwise(vs):
        assert all(a.latency(n) <= b.latency(n) + 1e-9 for n in (1, 4, 16))


def test_the_caps_an_early_exit_model_serves_by_default_budget_or_by_name(models_dir):
    from services.bench.superserve_depth import cap_frontier, chosen_caps
    from services.exits.depth_caps import lever_caps
    from services.exits.initial import initial_ramps
    from services.runtime.manifest import Manifest

    m = Manifest.load(models_dir / "efficientnet-lite0")
    caps, whence = chosen_caps(m, None, 0.02)
    assert caps == lever_caps(m.to_dict()) and len(caps) == 3 and "cheapest" in whence
    assert chosen_caps(m, "budget", 0.02)[0] == initial_ramps(m, 0.02)
    assert chosen_caps(m, "6, 2", 0.02) == ([2, 6], "as --caps names them")
    for bad in ("99", "x", ","):
        with pytest.raises(ValueError, match="trained ramps"):
            chosen_caps(m, bad, 0.02)
    front = cap_frontier(m, [2, 6])
    assert {r["subnet"] for r in front} <= {"depth<=2", "depth<=6", "depth<=final"}
    assert front[-1]["subnet"] == "depth<=final"


def test_live_policies_by_name_prefix_or_any_frontier_subnet():
    from services.bench.superserve_live import chosen_policies

    front = [{"subnet": k, "agreement": a} for k, a in (("s", 0.7), ("m", 0.8), ("l", 1.0))]
    assert len(chosen_policies(front, None)) == 7
    got = chosen_policies(front, "slackfit,clipper+ most,variant=m")
    assert got == {"slackfit": "slackfit", "clipper+ most accurate (100.00)": "variant=l",
                   "clipper+ m (80.00)": "variant=m"}
    with pytest.raises(ValueError, match="not on the frontier"):
        chosen_policies(front, "variant=x")
    conv = [{"subnet": k, "agreement": a} for k, a in (("D=1,1;W=0.25,1", 0.9),
                                                      ("D=2,2;W=1,1", 1.0))]
    assert chosen_policies(conv, "variant=D=1,1;W=0.25,1, slackfit,variant=D=2,2;W=1,1") == {
        "clipper+ D=1,1;W=0.25,1 (90.00)": "variant=D=1,1;W=0.25,1", "slackfit": "slackfit",
        "clipper+ D=2,2;W=1,1 (100.00)": "variant=D=2,2;W=1,1"}
    with pytest.raises(ValueError, match="unknown 'fastest'"):
        chosen_policies(front, "fastest")


def test_the_live_bench_says_which_variants_it_serves_and_where_caps_come_from():
    from services.bench.superserve_live import describe_variants

    front = [{"subnet": "depth<=4", "agreement": 0.74, "latency_ms": {"16": 45.7}},
             {"subnet": "depth<=final", "agreement": 1.0, "latency_ms": {"16": 83.4}}]
    caps = describe_variants(front, "as --caps names them")
    assert "depth<=4 (45.7 ms), depth<=final (83.4 ms)" in caps
    assert caps.endswith("the caps: as --caps names them")
    subnets = describe_variants(front, None)
    assert subnets.startswith("2 frontier subnets") and "caps" not in subnets
