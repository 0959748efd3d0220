"""The transformer supernet through `offramp prepare`'s path, on a tiny random BERT and
random token rows (seconds, not the 10-minute MiniLM preparation): rewired, heads fitted
per depth, a few distillation steps, searched and profiled into one hashed artifact and
a manifest of kind ``supernet`` (family ``transformer``), reused while the recipe holds;
served by name in place by the torch runtime, which refuses what it cannot serve."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from schemas.errors import ServingError
from services.launcher.supervisor import register_prepared
from services.prepare.supernet import SearchRecipe, prepare_minilm_supernet, subnet_rows
from services.runtime.manifest import Manifest
from services.runtime.supernet import SupernetRuntime
from services.store import Store
from services.zoo import supernet_minilm
from tests.integration.test_supernet_minilm import CLASSES, tiny_supernet, tokens

NAME = "supernet-minilm-tiny"
RECIPE = supernet_minilm.Recipe(importance=32, fit_heads=64, steps=3, batch=8)
SEARCH = SearchRecipe(random=4, mutations=2, calib=0, held_out=0)


def tiny_source() -> supernet_minilm.Source:
    """A random BERT teacher; rows whose label is their first token's class."""
    def split(n: int, seed: int):
        x = {k: v.numpy() for k, v in tokens(n, 16, seed).items()}
        return x, (x["input_ids"][:, 0] % CLASSES).astype(np.int64)

    (train, y_train), (held, y_held) = split(96, 2), split(48, 3)
    return supernet_minilm.Source(tiny_supernet(), train, y_train, held, y_held, "tiny-random0")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("minilm-supernet")
    said: list[str] = []
    target = prepare_minilm_supernet(root / "models", log=said.append, recipe=RECIPE,
                                     search=SEARCH, cache_dir=root / "cache", name=NAME,
                                     source=tiny_source())
    return root, target, said


def test_manifest_profile_and_reuse(prepared):
    root, target, said = prepared
    m = Manifest.load(target)
    assert m.kind == "supernet" and m.meta["family"] == "transformer" and m.ramps == []
    assert [t.name for t in m.inputs] == ["input_ids", "attention_mask"]
    assert m.verify(target) == []
    front = [r for r in m.meta["subnets"] if r["pareto"]]
    assert front and all(set(r["latency_ms"]) == {"1", "2", "4", "8", "16"} for r in front)
    assert all(r["accuracy"] is not None for r in m.meta["subnets"])
    assert any(r["subnet"] == m.meta["largest"] == "L=4;H=1;F=1" and r["agreement"] == 1.0
               for r in m.meta["subnets"])
    assert m.meta["teacher"]["held_out"] == 48
    assert any("distillation" in s or "fitted" in s for s in said)
    again: list[str] = []
    assert prepare_minilm_supernet(root / "models", log=again.append, recipe=RECIPE,
                                   search=SEARCH, cache_dir=root / "cache", name=NAME,
                                   source=tiny_source()) == target
    assert again[0].startswith(f"reusing {NAME}")


def test_runtime_serves_frontier_variants_by_name(prepared):
    _, target, _ = prepared
    m = Manifest.load(target)
    rt = SupernetRuntime(target, m)   # threads=0: keeps the test process as it is
    front = [r["subnet"] for r in m.meta["subnets"] if r["pareto"]]
    assert sorted({*front, m.meta["largest"]}) == rt.variants
    x = {k: v.numpy() for k, v in tokens(3, 16, 7).items()}
    for key in front:
        logits, extra = rt.run_range(0, 1, x, variant=key)
        assert extra is None and logits.shape == (3, m.classes)
        with torch.no_grad():
            alone = rt.net.extract(rt.subnet(key))(**{k: torch.from_numpy(v)
                                                      for k, v in x.items()}).numpy()
        np.testing.assert_allclose(logits, alone, atol=1e-5, rtol=1e-5)
    default, _ = rt.run_range(0, 1, x)
    np.testing.assert_array_equal(default, rt.run_range(0, 1, x, variant=m.meta["largest"])[0])
    rt.warm()
    off = [r["subnet"] for r in m.meta["subnets"] if r["subnet"] not in rt.variants]
    for bad, why in ((off[0] if off else "L=9;H=1;F=1", "not served" if off else "depth 9"),
                     ("D=1;W=1", "L=depth"), ("L=2;H=0.3;F=1", "0.3")):
        with pytest.raises(ServingError, match=why) as info:
            rt.run_range(0, 1, x, variant=bad)
        assert info.value.code == "bad_request"
    with pytest.raises(ServingError, match="attention_mask") as info:
        rt.run_range(0, 1, {"input_ids": x["input_ids"]})
    assert info.value.code == "bad_request"


def test_registration_writes_the_variant_profiles(prepared, store: Store):
    _, target, _ = prepared
    m = Manifest.load(target)
    register_prepared(store, target, 0.02)
    rows = store.subnet_profiles(NAME)
    assert sorted(r["variant"] for r in rows) == sorted(
        r["variant"] for r in subnet_rows(m) if r["pareto"])
    assert all(r["device"] == m.meta["device"] and r["latency_ms"][16] > 0 for r in rows)
