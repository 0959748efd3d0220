"""Pooled features at every ramp site from the serving call (``execute(features=True)``):
equal to pooling the site activations in numpy, for a tapped stage, a stage without active
ramps and a split stage, with the run's exits untouched."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.messages import ExitConfig
from services.runtime import taps
from services.runtime.manifest import Manifest
from services.runtime.pooling import pool_np, pool_of_arch
from services.runtime.stage import StageRuntime
from services.worker.stage_exec import execute
from services.zoo.registry import sample_inputs


def site_features(rt: StageRuntime, x) -> dict[int, np.ndarray]:
    """Each ramp's site activation (``run_all``) pooled in numpy, as its head pools it."""
    out: dict[int, np.ndarray] = {}

    def pool(r: int, act: np.ndarray, inputs) -> None:
        spec = rt.manifest.ramp(r)
        mask = inputs[spec.inputs[0]] if spec.inputs else None
        out[r] = pool_np(act, pool_of_arch(spec.arch), mask)

    rt.run_all(x, x if isinstance(x, dict) else None, on_site=pool)
    return out


def run(rt: StageRuntime, x, cfg: ExitConfig, features: bool):
    early: list = []
    batch = len(next(iter(x.values()))) if isinstance(x, dict) else len(x)
    out = execute(rt, rt.manifest.ramps, rt.first_block, rt.last_block, x,
                  np.full(batch, -1, np.int32), cfg,
                  lambda r, idx, lab, sc, lg: early.append((r, idx.tolist(), lab.tolist())),
                  features=features)
    return out, early


def check(rt: StageRuntime, x, active: list[int], atol: float, same_path: bool = True) -> None:
    """Features on equal the pooled sites; the run is the same as with features off (to the
    bit when both take the same path: the tapped stage, or split ranges)."""
    thresholds = {r.index: 0.5 for r in rt.ramps}  # some rows exit, some do not
    cfg = ExitConfig(rt.manifest.name, 1, thresholds=thresholds, active=active)
    off, early_off = run(rt, x, cfg, False)
    on, early_on = run(rt, x, cfg, True)
    assert off.features is None
    want = site_features(rt, x)
    assert sorted(on.features) == sorted(r.index for r in rt.ramps) == sorted(want)
    for r, got in on.features.items():
        assert got.dtype == np.float32 and got.shape == want[r].shape
        np.testing.assert_allclose(got, want[r], atol=atol, rtol=1e-4)
    assert on.ramp_ids == off.ramp_ids and early_on == early_off
    assert on.exit_at.tolist() == off.exit_at.tolist()
    same = np.array_equal if same_path else lambda a, b: np.allclose(a, b, atol=1e-5)
    for a, b in zip(on.ramp_pred + on.ramp_score, off.ramp_pred + off.ramp_score, strict=True):
        assert same(a, b)
    assert same(on.output, off.output)


@pytest.mark.parametrize("active", [[], [0], [0, 2], [1, 2, 0]])
@pytest.mark.parametrize("use_taps", [True, False])
def test_tiny_features_equal_the_pooled_sites(tiny_dir, active, use_taps):
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu", use_taps=use_taps)
    x = sample_inputs("tiny", 16, seed=5)
    check(rt, x, active, atol=1e-5)
    here = tuple(sorted(active))
    assert (rt.tapped(here, None, True) is not None) == use_taps, rt.tap_notes


def test_a_later_stage_yields_its_own_sites(tiny_dir):
    m = Manifest.load(tiny_dir)
    s0 = StageRuntime(tiny_dir, m, 0, 2, device="cpu")
    s1 = StageRuntime(tiny_dir, m, 2, m.num_blocks, device="cpu")
    mid = s0.run_all(sample_inputs("tiny", 8, seed=1))[0]
    for active in ([], [2]):
        check(s1, mid, active, atol=1e-5)
    check(s0, sample_inputs("tiny", 8, seed=1), [1], atol=1e-5)


@pytest.mark.parametrize("model,active", [("tiny", [0]), ("minilm-topics", [3])])
def test_features_of_a_head_that_does_not_fit_are_pooled_in_numpy(zoo_dir, model, active,
                                                                   monkeypatch):
    def refuse(*args, **kwargs):
        raise ValueError("head opset 99")

    monkeypatch.setattr(taps, "site_features", refuse)
    d = zoo_dir / model
    m = Manifest.load(d)
    rt = StageRuntime(d, m, 0, m.num_blocks, device="cpu", use_taps=True)
    x = sample_inputs(model, 4, seed=2)
    check(rt, x, active, atol=1e-4, same_path=False)  # no tapped stage with them: split
    assert any("with features" in n for n in rt.tap_notes)
    assert any(pool for k, sess in rt._merged.items() if k[4]
               for _, _, pool in rt._layouts[sess].features)       # raw sites, numpy pools


@pytest.mark.parametrize("model,active", [("efficientnet-lite0", [2, 7]),
                                          ("minilm-topics", [3, 8]),
                                          ("minilm-topics", [])])
@pytest.mark.parametrize("use_taps", [True, False])
def test_zoo_features_equal_the_pooled_sites(zoo_dir, model, active, use_taps):
    d = zoo_dir / model
    m = Manifest.load(d)
    rt = StageRuntime(d, m, 0, m.num_blocks, device="cpu", use_taps=use_taps)
    x = sample_inputs(model, 4, seed=3)
    if "attention_mask" in x:   # padding, so a mean over all tokens would differ
        assert (x["attention_mask"] == 0).any()
    check(rt, x, active, atol=1e-4)
    assert (rt.tapped(tuple(active), None, True) is not None) == use_taps, rt.tap_notes


def test_warm_builds_what_a_config_with_features_needs(tiny_dir):
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu")
    rt.warm([], None, features=True)
    rt.warm([1], None, features=True)
    built = set(rt._tapped)
    assert {((), (), True), ((1,), (m.ramp(1).file,), True)} <= built
    split = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu", use_taps=False)
    split.warm([1], None, features=True)
    assert {k[:3] for k in split._merged if k[4]} == {(0, 2, 1), (2, 4, None)}


def test_features_keep_each_tap_in_place_and_a_late_tap_is_caught(zoo_dir, monkeypatch):
    """Feature outputs must not pull later blocks ahead of a tap (an early answer would
    wait for the whole stage). A blocked-layout pooling of the inactive sites did exactly
    that on EfficientNet; the order check sees it through the runtime's renamed nodes."""
    from services.runtime import onnx_blocks, taps

    d = zoo_dir / "efficientnet-lite0"
    m = Manifest.load(d)
    rt = StageRuntime(d, m, 0, m.num_blocks, device="cpu")
    assert rt.tapped((2, 3, 5), None, True) is not None, rt.tap_notes
    monkeypatch.setattr(taps, "head_pooling",
                        lambda head: taps.pool_in_layout(onnx_blocks.head_pooling(head)))
    late = StageRuntime(d, m, 0, m.num_blocks, device="cpu")
    assert late.tapped((2, 3, 5), None, True) is None
    assert any("ran before its tap" in n for n in late.tap_notes), late.tap_notes
