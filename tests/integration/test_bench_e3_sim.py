"""``offramp bench e3 --sim`` end to end on `tiny` (it has three ramps): measured profile,
recorded trace, tuned exit config, the bus measured, every configuration simulated, JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from services.bench import e3, e3_inputs
from services.cli.main import main


@pytest.fixture
def small(monkeypatch, tmp_path, models_dir):
    """A private OFFRAMP_HOME (the bench's caches) and a smaller bench: a short trace, one
    profiling pass, short streams."""
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OFFRAMP_MODELS_DIR", str(models_dir))
    monkeypatch.setattr(e3_inputs, "TRACE_SAMPLES", 600)
    monkeypatch.setattr(e3_inputs, "PROFILE_PASSES", 1)
    monkeypatch.setattr(e3, "MAX_REQUESTS", 3000)
    monkeypatch.setattr(e3, "WARM_SAMPLES", 800)
    monkeypatch.setattr(e3, "FORECAST_WINDOWS", 8)
    return tmp_path


def test_bench_e3_sim_on_tiny_writes_every_key(small, capsys):
    out = small / "e3.json"
    rc = main(["bench", "e3", "--sim", "--json", str(out), "--model", "tiny", "--devices", "4",
               "--batches", "1,4", "--mixes", "80/20,20/80", "--requests", "400"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["mode"] == "simulated" and doc["model"] == "tiny"
    for policy in ("vanilla", "naive_ee", "e3"):
        assert set(doc[policy]) >= {"goodput_rps", "p50_ms", "p99_ms", "agreement", "cost"}
        assert doc[policy]["goodput_rps"] > 0
    assert doc["vanilla"]["agreement"] == 1.0
    assert doc["device_class"]["modeled"] is True and "modeled" in doc["device_class"]["name"]
    assert doc["optimizer_ms"] > 0 and doc["plan"]["feasible"]
    assert "forecast_mape" in doc and set(doc["forecast"]) >= {"windows", "ramps"}
    h = doc["headline"]
    assert (h["devices"], h["batch"], h["mix"], h["modeled"]) == (4, 4, "80/20", True)
    # every configuration: 2 classes (modeled A40, measured CPU) x 1 x 2 batches x 2 mixes
    assert len(doc["runs"]) == 8
    assert {(r["device_class"], r["modeled"]) for r in doc["runs"]} == \
        {(doc["device_class"]["name"], True), (doc["device_classes"][1]["name"], False)}
    for r in doc["runs"]:
        for policy in ("vanilla", "naive_ee", "e3"):
            s = r[policy]
            assert s["answered"] + s["dropped"] == r["requests"]
            assert "at_common_load" in s
    assert doc["profile"]["measured_at"] and doc["trace"]["samples"] == 600
    # a tuner that adapts starts with its headroom: tuned to half the constraint
    start = doc["adaptive_start"]
    assert start["constraint"] == 0.5 * doc["exit_config"]["constraint"]
    assert start["agreement_on_trace"] >= 1 - start["constraint"]
    assert len(start["thresholds"]) == len(doc["exit_config"]["thresholds"])
    printed = capsys.readouterr().out
    assert "SIMULATED" in printed and "MODELED" in printed and "optimizer:" in printed

    # a rerun reuses the measured profile and the trace; --device-profile replaces the A40
    gpu = small / "gpu.json"
    gpu.write_text(json.dumps({"name": "my-gpu", "cost_per_s": 2.0,
                               "full_ms": {"1": 1.0, "4": 1.2, "16": 2.0},
                               "link": {"ms_per_byte": 1e-7, "fixed_ms": 0.01}}))
    assert main(["bench", "e3", "--sim", "--json", str(out), "--model", "tiny", "--devices",
                 "4", "--batches", "4", "--mixes", "50/50", "--requests", "400",
                 "--device-profile", str(gpu)]) == 0
    again = json.loads(out.read_text())
    assert again["profile"]["cached"] and again["trace"]["cached"]
    assert again["profile"]["measured_at"] == doc["profile"]["measured_at"]
    c = again["device_class"]
    assert (c["name"], c["modeled"], c["cost_per_s"]) == ("my-gpu", True, 2.0)
    assert c["link"]["fixed_ms"] == 0.01 and again["headline"]["device_class"] == "my-gpu"
    assert "my-gpu-modeled" in capsys.readouterr().out


def test_bench_e3_live_serves_the_three_policies_on_real_workers(small, tmp_path, capsys):
    """Live on tiny, one worker, a few seconds a phase: every policy answered on its own
    stack, the figures the issue names are there, E3 made plans."""
    out = tmp_path / "live.json"
    assert main(["bench", "e3", "--json", str(out), "--model", "tiny", "--workers", "1",
                 "--seconds", "2", "--warm-s", "2", "--slo-ms", "2000"]) == 0
    doc = json.loads(out.read_text())
    assert doc["mode"] == "live" and doc["workers"] == 1
    for p in ("vanilla", "naive_ee", "e3"):
        assert set(doc[p]) == {"goodput_rps", "p50_ms", "p99_ms", "agreement", "cost"}
        assert doc[p]["goodput_rps"] > 0 and doc["saturated"][p]["answered_in_slo"] > 0
        assert doc["saturated"][p]["mean_batch_by_stage"]
    assert doc["vanilla"]["agreement"] == 1.0  # the full model agrees with itself
    assert doc["saturated"]["e3"]["plans"] and doc["optimizer_ms"] is not None
    assert "forecast_mape" in doc
    assert "E3 / vanilla" in capsys.readouterr().out


def test_gpu_curve_picks_a_published_subnet_curve_and_names_it():
    from services.optimizer.block_costs import LatencyTable

    sizes = (1, 4, 16)
    cpu = LatencyTable.build(sizes, [[1.0, 4.0, 16.0], [2.0, 8.0, 32.0]], [[0.1, 0.4, 1.6]])
    full = {1: 3.0, 4: 12.0, 16: 48.0}
    default = e3_inputs.gpu_class(cpu, full)
    flat = e3_inputs.gpu_class(cpu, full, subnet=0)
    assert (default.name, flat.name) == ("a40-modeled", "a40-subnet0-modeled")
    assert default.modeled and flat.modeled and "subnet 0" in flat.source
    # subnet 0's A40 curve is the flattest: batch 16 costs less than 2x batch 1
    assert flat.table.blocks_at(16).sum() < 2 * flat.table.blocks_at(1).sum()
    assert default.table.blocks_at(16).sum() > 4 * default.table.blocks_at(1).sum()
    with pytest.raises(ValueError, match="--gpu-curve 9"):
        e3_inputs.gpu_class(cpu, full, subnet=9)
    # by default the bench passes the model's compute: the nearest subnet's curve
    small = e3_inputs.gpu_class(cpu, full, model_mmacs=86.3)
    assert small.name == "a40-modeled" and "subnet 0 (962 MMACs), the nearest" in small.source
    assert np.allclose(small.table.block_ms, flat.table.block_ms)


def test_the_modeled_class_follows_the_model_s_compute_on_a_log_scale():
    subnets = json.loads(e3_inputs.GPU_CURVES.read_text())["subnets"]
    pick = {m: e3_inputs.nearest_subnet(subnets, m)["id"]
            for m in (10.0, 86.3, 385.2, 1250.0, 1400.0, 1650.0, 3000.0, 5000.0, 20000.0)}
    assert pick == {10.0: 0, 86.3: 0, 385.2: 0, 1250.0: 1, 1400.0: 1, 1650.0: 2, 3000.0: 4,
                    5000.0: 4, 20000.0: 5}
    assert [e3_inputs.subnet_mmacs(s) for s in subnets] == [962.0, 1500, 1800, 2000, 4000,
                                                           e3_inputs.FULL_SUBNET_MMACS]
    assert e3_inputs.nearest_subnet(subnets, 0.0)["id"] == 0  # nothing counted: the smallest


def test_with_adapt_the_common_phase_starts_where_the_tuner_left_off(tmp_path):
    from types import SimpleNamespace

    from services.bench.e3_live import adapted_thresholds
    from services.store.migrate import upgrade
    from services.store.repository import Store

    cfg = SimpleNamespace(database_url=f"sqlite:///{tmp_path / 's.db'}")
    upgrade(cfg.database_url)
    start = {0: 0.3, 1: 0.2, 2: 0.1}
    with Store(cfg.database_url) as store:
        assert adapted_thresholds(cfg, "tiny", start) == start  # no config yet
        store.save_exit_config("tiny", {0: 0.05, 1: 0.25}, [0, 1], "compute", "tuner")
    assert adapted_thresholds(cfg, "tiny", start) == {0: 0.05, 1: 0.25, 2: 0.1}


def test_trace_seed_option_takes_any_seed_and_defaults_to_the_bench_s():
    from types import SimpleNamespace

    assert e3.options(SimpleNamespace())["trace_seed"] == e3_inputs.TRACE_SEED
    assert e3.options(SimpleNamespace(trace_seed=0))["trace_seed"] == 0
    assert e3.options(SimpleNamespace(trace_seed=3))["trace_seed"] == 3
