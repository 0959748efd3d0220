"""Every zoo model as prepared: ramps at graph sites, deeper ramps agreeing more with the
final model (a monotone trend, not exact numbers), and block files that reproduce the
unsplit model."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from services.prepare.pipeline import ZOO, sites_json
from services.runtime.manifest import Manifest
from services.runtime.stage import StageRuntime
from services.zoo.registry import sample_inputs


@pytest.mark.parametrize("name", sorted(ZOO))
def test_deeper_ramps_agree_more(zoo_dir, name):
    m = Manifest.load(zoo_dir / name)
    assert len(m.ramps) >= 3
    agree = np.array([r.agreement for r in sorted(m.ramps, key=lambda r: r.after_block)])
    rank = np.corrcoef(np.arange(len(agree)), np.argsort(np.argsort(agree)))[0, 1]
    assert rank > 0.6, agree
    third = max(1, len(agree) // 3)
    assert agree[-third:].mean() > agree[:third].mean(), agree


@pytest.mark.parametrize("name", sorted(ZOO))
def test_blocks_reproduce_the_unsplit_model(zoo_dir, name):
    d = zoo_dir / name
    m = Manifest.load(d)
    assert m.verify(d) == []
    x = sample_inputs(name, 3, seed=4)
    full = ort.InferenceSession(str(d / m.meta["full_model_file"]),
                                providers=["CPUExecutionProvider"])
    ref = full.run(None, x)[0]
    y, ramp_logits = StageRuntime(d, m, 0, m.num_blocks, device="cpu").run_all(x)
    np.testing.assert_allclose(y, ref, atol=1e-4)
    assert sorted(ramp_logits) == [r.index for r in m.ramps]
    # Sites are in execution order and every ramp reads one of them.
    report = sites_json(m)
    order = [s["index"] for s in report["sites"]]
    assert order == sorted(order)
    assert all(0 <= r["site"] < len(order) and r["params"] > 0 for r in report["ramps"])
