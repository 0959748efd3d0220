"""`offramp prepare` on models it has never seen: an ONNX ResNet-style file and a
TorchScript chain CNN, with user bootstrap data; plus the input errors a user can hit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from services.prepare.export import to_onnx
from services.prepare.pipeline import SiteChoice, prepare
from services.prepare.source import SourceError
from services.runtime import onnx_blocks
from services.runtime.manifest import Manifest
from services.runtime.stage import StageRuntime
from tests.integration.test_model_sites import ResNetish, VGGish, bert_onnx


def quiet(_msg: str) -> None:
    pass


def _images(n: int, seed: int) -> np.ndarray:
    # Smooth random images: structure a small CNN responds to with varied predictions.
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, 3, 4, 4)).astype(np.float32)
    return np.repeat(np.repeat(base, 4, axis=2), 4, axis=3) + 0.3 * rng.standard_normal(
        (n, 3, 16, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def resnet_onnx(tmp_path_factory):
    torch.manual_seed(0)
    model = ResNetish().eval()
    d = tmp_path_factory.mktemp("user")
    path = d / "resnetish.onnx"
    path.write_bytes(to_onnx(model, (torch.zeros(1, 3, 16, 16),), ["image"], ["logits"]))
    np.savez(d / "data.npz", image=_images(600, 1))
    return path, d / "data.npz"


@pytest.fixture(scope="module")
def prepared_resnet(resnet_onnx, tmp_path_factory):
    path, data = resnet_onnx
    models = tmp_path_factory.mktemp("models")
    out = prepare(str(path), models, data=data, log=quiet, progress=quiet)
    return out, path


def test_resnet_sites_only_between_residual_blocks(prepared_resnet):
    out, _ = prepared_resnet
    m = Manifest.load(out)
    assert m.name == "resnetish" and m.classes == 5
    assert m.inputs[0].name == "image" and m.inputs[0].shape == [3, 16, 16]
    tensors = [s["tensor"] for s in m.meta["sites"]]
    # stem + the first three residual blocks (the last one only feeds the head)
    assert len(tensors) == 4
    assert "stem" in tensors[0]
    assert all("Relu" in t and f"blocks.{k}" in t for k, t in enumerate(tensors[1:])), tensors
    assert [r.site for r in m.ramps] == tensors and m.num_blocks == 5
    assert (out / "sites.txt").read_text().count("inside a skip connection") >= 6


def test_stage_outputs_match_unsplit_model(prepared_resnet):
    out, path = prepared_resnet
    m = Manifest.load(out)
    x = {"image": _images(5, 9)}
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, x)[0]
    whole, ramp_logits = StageRuntime(out, m, 0, m.num_blocks, device="cpu").run_all(x)
    np.testing.assert_allclose(whole, ref, atol=1e-4)
    assert sorted(ramp_logits) == [r.index for r in m.ramps]
    # Two stages from block files, and a stage assembled into one graph, agree too.
    mid, _ = StageRuntime(out, m, 0, 2, device="cpu").run_all(x)
    tail, _ = StageRuntime(out, m, 2, m.num_blocks, device="cpu").run_all(mid)
    np.testing.assert_allclose(tail, ref, atol=1e-4)
    parts = [onnx.load(str(out / b.file)) for b in m.blocks]
    merged = onnx_blocks.assemble(parts, 1, m.num_blocks)
    first = StageRuntime(out, m, 0, 1, device="cpu").run_all(x)[0]
    sess = ort.InferenceSession(merged.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {m.blocks[1].input_names[0]: first})[0], ref,
                               atol=1e-4)


def test_second_prepare_reuses_by_hash(prepared_resnet, resnet_onnx):
    out, _ = prepared_resnet
    path, data = resnet_onnx
    logs: list[str] = []
    before = Manifest.load(out).version
    prepare(str(path), out.parent, data=data, log=logs.append, progress=quiet)
    assert any(line.startswith("reusing resnetish") and before in line for line in logs)


def test_torchscript_chain_cnn_gets_a_site_per_layer(tmp_path):
    torch.manual_seed(0)
    model = VGGish().eval()
    ts = torch.jit.trace(model, torch.zeros(1, 3, 16, 16))
    ts.save(str(tmp_path / "vgg.pt"))
    np.savez(tmp_path / "data.npz", input=_images(400, 2))
    out = prepare(str(tmp_path / "vgg.pt"), tmp_path / "models", data=tmp_path / "data.npz",
                  log=quiet, progress=quiet)
    m = Manifest.load(out)
    assert len(m.meta["sites"]) == len(VGGish.CONVS_AT_SITES)  # one per conv layer
    assert len(m.ramps) == len(VGGish.CONVS_AT_SITES)
    x = {"input": _images(3, 5)}
    with torch.no_grad():
        ref = model(torch.from_numpy(x["input"])).numpy()
    y, _ = StageRuntime(out, m, 0, m.num_blocks, device="cpu").run_all(x)
    np.testing.assert_allclose(y, ref, atol=1e-4)


def test_sites_can_be_restricted(resnet_onnx, tmp_path):
    path, data = resnet_onnx
    out = prepare(str(path), tmp_path, data=data, log=quiet, progress=quiet,
                  choice=SiteChoice(keep=("1", "3")), name="two")
    m = Manifest.load(out)
    assert m.name == "two" and len(m.ramps) == 2 and m.num_blocks == 3
    sites = [s["tensor"] for s in m.meta["sites"]]
    assert [r.site for r in m.ramps] == [sites[1], sites[3]]
    with pytest.raises(SourceError, match="nosuch"):
        prepare(str(path), tmp_path, data=data, log=quiet, progress=quiet,
                choice=SiteChoice(keep=("nosuch",)), name="bad")


def test_user_input_errors(resnet_onnx, tmp_path):
    path, _ = resnet_onnx
    with pytest.raises(SourceError, match="--data"):
        prepare(str(path), tmp_path, log=quiet)
    np.savez(tmp_path / "wrong.npz", pixels=_images(300, 0))
    with pytest.raises(SourceError, match="lacks arrays for inputs"):
        prepare(str(path), tmp_path, data=tmp_path / "wrong.npz", log=quiet)
    np.savez(tmp_path / "shape.npz", image=np.zeros((300, 3, 8, 8), np.float32))
    with pytest.raises(SourceError, match="per-sample shape"):
        prepare(str(path), tmp_path, data=tmp_path / "shape.npz", log=quiet)
    np.savez(tmp_path / "few.npz", image=_images(20, 0))
    with pytest.raises(SourceError, match="at least 200"):
        prepare(str(path), tmp_path, data=tmp_path / "few.npz", log=quiet)
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(SourceError, match="not an ONNX model"):
        prepare(str(tmp_path / "junk.onnx"), tmp_path, data=tmp_path / "few.npz", log=quiet)
    with pytest.raises(SourceError, match="does not exist"):
        prepare(str(tmp_path / "missing.onnx"), tmp_path, log=quiet)
    with pytest.raises(SourceError, match="few.npz holds arrays, not a model"):
        prepare(str(tmp_path / "few.npz"), tmp_path, log=quiet)
    np.savez(tmp_path / "ok.npz", image=_images(300, 0))
    for mask in ("image", "none"):  # an image model's ramps average over space regardless
        with pytest.raises(SourceError, match=r"for text models.*image \[3, 16, 16\]"):
            prepare(str(path), tmp_path, data=tmp_path / "ok.npz", log=quiet, mask_input=mask)


def test_cli_json_report(resnet_onnx, tmp_path):
    path, data = resnet_onnx
    out = tmp_path / "sites.json"
    env_home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "prepare", str(path), "--data", str(data),
         "--models-dir", str(tmp_path / "models"), "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "OFFRAMP_HOME": str(env_home)})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["model"] == "resnetish"
    assert [s["index"] for s in report["sites"]] == sorted(s["index"] for s in report["sites"])
    assert {"tensor", "index"} <= set(report["sites"][0])
    for r in report["ramps"]:
        assert {"site", "agreement", "cost_ms", "params"} <= set(r)
        assert 0 <= r["site"] < len(report["sites"]) and r["params"] > 0
    assert "feasible ramp sites" in proc.stderr  # the table
    # recorded in the store under OFFRAMP_HOME
    assert (env_home / "offramp.db").exists() or any(env_home.glob("*.db"))


def _prepared_tinybert(tmp_path, seed: int):
    """A two-input (ids, mask) transformer prepared from 300 padded sequences:
    (model file, prepared folder, ids, mask)."""
    path = tmp_path / "tinybert.onnx"
    path.write_bytes(bert_onnx().SerializeToString())
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, (300, 8)).astype(np.int64)
    mask = (np.arange(8)[None, :] < rng.integers(2, 9, (300, 1))).astype(np.int64)
    np.savez(tmp_path / "data.npz", ids=ids, mask=mask)
    out = prepare(str(path), tmp_path / "models", data=tmp_path / "data.npz", log=quiet,
                  progress=quiet)
    return path, out, ids, mask


def test_two_input_transformer_stages_carry_the_mask(tmp_path):
    """Blocks after the first read the attention mask too: a later stage gets it as a model
    input (what workers pass along as ``carry``) and the split still equals the model."""
    path, out, ids, mask = _prepared_tinybert(tmp_path, seed=0)
    m = Manifest.load(out)
    assert [t.name for t in m.inputs] == ["ids", "mask"] and m.inputs[0].dtype == "<i8"
    # an integer "mask" input beside the ids: ramps average over real tokens, reading it
    assert len(m.ramps) == 5 and all(r.arch == "mmean_fc" and r.inputs == ["mask"]
                                     for r in m.ramps)
    assert m.model_inputs_of(1, m.num_blocks) == ["mask"]  # what stage 0 carries on
    x = {"ids": ids[:4], "mask": mask[:4]}
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, x)[0]
    mid, _ = StageRuntime(out, m, 0, 2, device="cpu").run_all(x)
    tail, _ = StageRuntime(out, m, 2, m.num_blocks, device="cpu").run_all(mid, {"mask": mask[:4]})
    np.testing.assert_allclose(tail, ref, atol=1e-4)
    with pytest.raises(ValueError, match="mask"):
        StageRuntime(out, m, 2, m.num_blocks, device="cpu").run_all(mid)


def test_masked_mean_ramps_ignore_padding_fused_split_and_tapped_alike(tmp_path):
    """A text model's ramps read the attention mask: what sits at padded positions does not
    change their logits; the head alone, fused into its range and tapped inside the stage
    all agree, also in a stage whose own blocks never read the mask (the head adds it)."""
    from services.prepare.ramps import pool_np
    from services.runtime import taps
    from services.runtime.stage import as_numpy

    _, out, ids, mask = _prepared_tinybert(tmp_path, seed=1)
    m = Manifest.load(out)
    # a block that reads only the previous activation, with a ramp after it
    lone = next(b.index for b in m.blocks[1:] if b.input_names == b.input_names[:1]
                and any(r.after_block == b.index for r in m.ramps))
    r = next(r.index for r in m.ramps if r.after_block == lone)
    assert m.model_inputs_of(lone, lone + 1) == ["mask"]  # the carry includes the head's read
    x = {"ids": ids[:6], "mask": mask[:6]}
    x["mask"][:, 4:] = 0
    full = StageRuntime(out, m, 0, m.num_blocks, device="cpu")
    act = x
    for i in range(lone):
        act = full.run_block(i, act, x)
    rt = StageRuntime(out, m, lone, lone + 1, device="cpu")
    site = rt.run_block(lone, act, x)
    alone = rt.run_ramp(r, site, x)
    noisy = site.copy()
    noisy[:, 4:] += 100.0  # padding only
    np.testing.assert_allclose(rt.run_ramp(r, noisy, x), alone, atol=1e-4)
    assert not np.allclose(rt.run_ramp(r, noisy, {"mask": np.ones_like(x["mask"])}), alone,
                           atol=1e-2)  # the same head without the mask sees the change
    with pytest.raises(ValueError, match="mask"):
        rt.run_ramp(r, site)
    _, fused = rt.run_range(lone, lone + 1, act, x, r)
    np.testing.assert_allclose(fused, alone, atol=1e-4)
    sess = rt.tapped((r,))
    assert sess is not None and "mask" in [i.name for i in sess.get_inputs()]
    got, outcomes = rt.run_tapped(sess, act, x, taps.tap_plan(((r, 0.0),), "max_softmax"),
                                  np.full(6, -1, np.int32))
    np.testing.assert_allclose(as_numpy(got), site, atol=1e-5)
    assert outcomes[0][:, 0].astype(int).tolist() == alone.argmax(1).tolist()
    # and the head is the masked mean of the site, then its linear layer
    weights = {tuple(t.dims): onnx.numpy_helper.to_array(t)
               for t in onnx.load(str(out / m.ramp(r).file)).graph.initializer}
    w, b = weights[(m.classes, site.shape[2])], weights[(m.classes,)]
    np.testing.assert_allclose(pool_np(site, "masked_mean", x["mask"]) @ w.T + b, alone,
                               atol=1e-4)


def test_mask_input_chooses_the_text_ramps_pooling(tmp_path):
    path, _, _ids, _mask = _prepared_tinybert(tmp_path, seed=2)
    data = tmp_path / "data.npz"
    plain = prepare(str(path), tmp_path / "plain", data=data, log=quiet, progress=quiet,
                    mask_input="none")
    m = Manifest.load(plain)
    assert all(r.arch == "mean_fc" and r.inputs == [] for r in m.ramps)
    assert m.model_inputs_of(1, 2) == []  # block 1 reads only its activation: nothing to carry
    with pytest.raises(SourceError, match="not an input.*'ids', 'mask'"):
        prepare(str(path), tmp_path / "bad", data=data, log=quiet, progress=quiet,
                mask_input="attention_mask")


def test_ramp_targets_choose_what_the_ramps_learn(tmp_path):
    """--ramp-targets softmax is part of the recipe: the top-1 copy is rebuilt, not reused."""
    path, out, _, _ = _prepared_tinybert(tmp_path, seed=3)
    top1 = Manifest.load(out)
    assert "targets=" not in top1.meta["recipe"]
    said: list[str] = []
    soft_dir = prepare(str(path), tmp_path / "models", data=tmp_path / "data.npz",
                       log=said.append, progress=quiet, ramp_targets="softmax")
    soft = Manifest.load(soft_dir)
    assert any("another recipe; rebuilding" in m for m in said)
    assert "targets=softmax@0.5" in soft.meta["recipe"]
    assert [r.agreement for r in soft.ramps] != [r.agreement for r in top1.ramps]
    with pytest.raises(ValueError, match="unknown ramp targets 'logits'"):
        prepare(str(path), tmp_path / "models", data=tmp_path / "data.npz", log=quiet,
                progress=quiet, ramp_targets="logits")
