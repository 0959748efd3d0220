"""Recording a replay trace through the runtime (tiny)."""

from __future__ import annotations

import numpy as np
import pytest

from services.exits.scores import exit_score
from services.runtime.manifest import Manifest
from services.runtime.ramp_heads import load_head
from services.runtime.stage import StageRuntime
from services.sim.trace import Trace, TraceError, record_trace
from services.zoo.registry import sample_inputs


def test_record_trace_on_tiny(models_dir, tmp_path) -> None:
    model_dir = models_dir / "tiny"
    manifest = Manifest.load(model_dir)
    x = sample_inputs("tiny", 40, seed=5)["x"]
    chunks = iter([{"x": x[:32]}, {"x": x[32:]}])
    said: list[str] = []
    arrivals = np.linspace(0.0, 1.0, 40)
    tr = record_trace(model_dir, chunks, arrivals=arrivals, progress=said.append)
    r = len(manifest.ramps)
    assert tr.ramp_pred.shape == (r, 40) and tr.ramp_score.shape == (r, 40)
    assert 1 <= len(said) <= 2 and "40 samples" in said[-1]  # at most every 2 s, and the end

    # same answers as running the model directly
    final, ramps = StageRuntime(model_dir, manifest, 0, manifest.num_blocks, device="cpu") \
        .run_all({"x": x})
    assert (tr.final_pred == final.argmax(axis=1)).all()
    ids = sorted(ramps)
    assert (tr.ramp_pred == np.stack([ramps[i].argmax(axis=1) for i in ids])).all()
    assert np.allclose(tr.ramp_score, np.stack([exit_score(ramps[i]) for i in ids]), atol=1e-6)

    # latencies: what a worker pays, from the manifest's serving profile (batch 1)
    ramps_sorted = sorted(manifest.ramps, key=lambda q: q.index)
    assert np.allclose(tr.prefix_ms[-1], manifest.meta["range_ms"])
    assert np.all(np.diff(tr.prefix_ms) >= 0)
    assert np.allclose(tr.ramp_cost_ms, [q.serve_ms for q in ramps_sorted])
    assert tr.meta["model"] == "tiny" and tr.meta["score"] == "max_softmax"

    path = tr.save(tmp_path / "sub" / "tiny.npz")
    back = Trace.load(path)
    for k in ("ramp_pred", "ramp_score", "final_pred", "prefix_ms", "ramp_cost_ms", "arrival_s"):
        assert np.array_equal(getattr(back, k), getattr(tr, k)), k
    assert back.meta == tr.meta


def test_record_needs_inputs(models_dir) -> None:
    with pytest.raises(TraceError, match="no inputs"):
        record_trace(models_dir / "tiny", iter([]), progress=None)


@pytest.mark.parametrize("model", ["tiny", "minilm-topics"])
def test_features_reproduce_every_ramps_answers(zoo_dir, tmp_path, model) -> None:
    """The recorded features through the recorded heads give the recorded predictions and
    scores: a replay can score any other head on them."""
    model_dir = zoo_dir / model
    manifest = Manifest.load(model_dir)
    x = sample_inputs(model, 24, seed=3)
    tr = record_trace(model_dir, iter([x]), progress=None, features=True)
    back = Trace.load(tr.save(tmp_path / "t.npz"))
    f = back.features
    assert f is not None and len(f.by_site) == len(manifest.ramps)
    for k, r in enumerate(sorted(manifest.ramps, key=lambda q: q.index)):
        head = load_head(model_dir, r)
        assert np.array_equal(f.weight[k], head.weight) and np.array_equal(f.bias[k], head.bias)
        logits = f.by_site[k] @ f.weight[k].T + f.bias[k]
        assert (logits.argmax(axis=1) == back.ramp_pred[k]).all()
        assert np.allclose(exit_score(logits), back.ramp_score[k], atol=1e-4)
    assert f.final_logits is not None and f.final_logits.shape == (24, manifest.classes)
    assert (f.final_logits.argmax(axis=1) == back.final_pred).all()
    assert back.meta["head_pools"][0] in ("gap", "masked_mean")
    # what publishing them costs a run, timed while recording, for the replay to charge
    assert isinstance(back.meta["feature_share"], float) and back.meta["feature_share"] >= 0


def test_trace_record_reads_a_users_inputs_file(models_dir, tmp_path, capsys) -> None:
    from services.cli.main import main

    x = sample_inputs("tiny", 40, seed=5)["x"].astype(np.float64)  # cast to the model's dtype
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "t.npz"
    assert main(["trace", "record", "--model", "tiny", "--models-dir", str(models_dir),
                 "--inputs", str(tmp_path / "x.npy"), "--out", str(out), "--quiet"]) == 0
    tr = Trace.load(out)
    assert tr.n_samples == 40 and tr.meta["workload"] == f"file:{tmp_path / 'x.npy'}"
    np.save(tmp_path / "bad.npy", x[:, :5])
    assert main(["trace", "record", "--model", "tiny", "--models-dir", str(models_dir),
                 "--inputs", str(tmp_path / "bad.npy"), "--out", str(out), "--quiet"]) == 2
    assert "per-sample shape [5], the model wants [16]" in capsys.readouterr().err
