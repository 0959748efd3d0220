"""A supernet prepared by `offramp prepare`'s path: one hashed artifact with the frontier's
normalization statistics, a profile in the manifest, reused while the recipe holds;
served in place by the torch runtime, which refuses variants it cannot serve; registered
with its variant profiles."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from schemas.errors import ServingError
from services.launcher.supervisor import register_prepared
from services.prepare.supernet import prepare_supernet, subnet_rows
from services.runtime.manifest import Manifest
from services.runtime.supernet import SupernetRuntime
from services.store import Store
from tests.conftest import SUPERNET_TINY, tiny_supernet_recipes


def test_prepared_supernet_manifest_and_reuse(supernet_dir):
    target = supernet_dir / SUPERNET_TINY
    m = Manifest.load(target)
    assert m.kind == "supernet" and m.ramps == [] and len(m.blocks) == 1
    assert m.verify(target) == []
    front = [r for r in m.meta["subnets"] if r["pareto"]]
    assert front and all(set(r["latency_ms"]) == {"1", "2", "4", "8", "16"} for r in front)
    assert any(r["subnet"] == m.meta["largest"] and r["agreement"] == 1.0
               for r in m.meta["subnets"])
    said = []
    recipe, search = tiny_supernet_recipes()
    assert prepare_supernet(supernet_dir, log=said.append, name=SUPERNET_TINY,
                            recipe=recipe, search=search) == target
    assert said and said[0].startswith(f"reusing {SUPERNET_TINY}")


def test_runtime_serves_frontier_variants_in_place(supernet_dir):
    target = supernet_dir / SUPERNET_TINY
    m = Manifest.load(target)
    rt = SupernetRuntime(target, m)  # threads=0: keeps the test process as it is
    front = [r["subnet"] for r in m.meta["subnets"] if r["pareto"]]
    assert sorted({*front, m.meta["largest"]}) == rt.variants   # the model as trained too
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    for key in front:
        logits, extra = rt.run_range(0, 1, {"image": x}, variant=key)
        assert extra is None and logits.shape == (3, m.classes)
        with torch.no_grad():
            alone = rt.net.extract(rt.subnet(key))(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(logits, alone, atol=1e-5, rtol=1e-5)
    default, _ = rt.run_range(0, 1, x)
    largest, _ = rt.run_range(0, 1, x, variant=m.meta["largest"])
    np.testing.assert_array_equal(default, largest)
    off = [r["subnet"] for r in m.meta["subnets"] if not r["pareto"]]
    for bad, why in ((off[0] if off else "D=9,9;W=1,1", "not served" if off else "depth 9"),
                     ("D=1;W=1", "stages"), ("nonsense", "D=d1")):
        with pytest.raises(ServingError, match=why) as info:
            rt.run_range(0, 1, x, variant=bad)
        assert info.value.code == "bad_request"
    assert rt.actuation_ms(front[0], repeats=50) < 1.0


def test_registration_writes_the_variant_profiles(supernet_dir, store: Store):
    target = supernet_dir / SUPERNET_TINY
    m = Manifest.load(target)
    register_prepared(store, target, 0.02)
    rows = store.subnet_profiles(SUPERNET_TINY)
    assert sorted(r["variant"] for r in rows) == sorted(
        r["variant"] for r in subnet_rows(m) if r["pareto"])
    assert all(r["device"] == m.meta["device"] and r["latency_ms"][16] > 0 for r in rows)
    assert len(store.subnet_profiles(SUPERNET_TINY, pareto=False)) == len(m.meta["subnets"])
