"""prepare(bootstrap=False) (`offramp prepare --no-bootstrap`) on tiny: the ramps of a
bootstrapped copy, costed as usual, but untrained zero heads that start inactive; cached
like any preparation and kept apart from the bootstrapped copy."""

import shutil
from dataclasses import replace

import numpy as np
import onnx
import pytest

from services.exits.initial import initial_ramps
from services.exits.linear_head import LinearHead
from services.launcher.supervisor import register_prepared
from services.prepare import source
from services.prepare.pipeline import prepare
from services.prepare.source import SourceError
from services.runtime.manifest import Manifest
from services.runtime.ramp_heads import load_head, save_head


def quiet(_msg: str) -> None:
    pass


def no_bootstrap_data(n: int, seed: int):
    raise AssertionError("bootstrap data read for a --no-bootstrap preparation")


def copy_of(tiny_dir, models_dir):
    """The session's bootstrapped tiny in ``models_dir`` (an intact copy: reused, not retrained)."""
    shutil.copytree(tiny_dir, models_dir / "tiny")
    return models_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_dir):
    """tiny bootstrapped, then tiny-cold beside it without bootstrap data (none may be read)."""
    d = copy_of(tiny_dir, tmp_path_factory.mktemp("models"))
    prepare("tiny", d, log=quiet, progress=quiet)
    warm = {p.name: p.stat().st_mtime_ns for p in (d / "tiny").iterdir()}
    with pytest.MonkeyPatch.context() as mp:
        spec = source.get_spec("tiny")
        mp.setattr(source, "get_spec", lambda name: replace(spec, bootstrap=no_bootstrap_data))
        prepare("tiny", d, log=quiet, progress=quiet, name="tiny-cold", bootstrap=False)
    return d, warm


def test_ramps_exist_like_the_bootstrapped_ones_but_untrained(models):
    d, _ = models
    warm, cold = Manifest.load(d / "tiny"), Manifest.load(d / "tiny-cold")
    assert cold.name == "tiny-cold" and cold.bootstrap is False and warm.bootstrap is True
    assert cold.verify(d / "tiny-cold") == []
    assert [(r.site, r.after_block, r.arch, r.params, r.inputs) for r in cold.ramps] == \
        [(r.site, r.after_block, r.arch, r.params, r.inputs) for r in warm.ramps]
    assert all(not r.trained and r.agreement is None for r in cold.ramps)
    assert all(r.trained and r.agreement > 0.5 for r in warm.ramps)
    assert [b.output_shape for b in cold.blocks] == [b.output_shape for b in warm.blocks]
    assert cold.meta["bootstrap_samples"] == 0 and "bootstrap=0" in cold.meta["recipe"]
    # Costed as usual, so the latency profile holds.
    assert cold.full_ms > 0 and cold.meta["range_ms"] > 0
    assert all(r.cost_ms > 0 and r.prefix_ms > 0 and r.serve_ms >= r.cost_ms
               for r in cold.ramps)
    assert all(set(r.cost_by_batch) == {"1", "4", "16"} for r in cold.ramps)


def test_heads_are_zero_with_the_same_graph(models):
    d, _ = models
    warm, cold = Manifest.load(d / "tiny"), Manifest.load(d / "tiny-cold")
    for w, c in zip(warm.ramps, cold.ramps, strict=True):
        head = load_head(d / "tiny-cold", c)
        assert head.weight.shape == (10, 32) and head.bias.shape == (10,)
        assert not head.weight.any() and not head.bias.any()
        gw = onnx.load(str(d / "tiny" / w.file)).graph
        gc = onnx.load(str(d / "tiny-cold" / c.file)).graph
        assert [n.op_type for n in gc.node] == [n.op_type for n in gw.node]
        assert [(t.name, list(t.dims)) for t in gc.initializer] == \
            [(t.name, list(t.dims)) for t in gw.initializer]
        assert [i.name for i in gc.input] == [i.name for i in gw.input]


def test_a_refitted_head_is_saved_and_read_back(models):
    d, _ = models
    ramp = Manifest.load(d / "tiny-cold").ramps[1]
    rng = np.random.default_rng(0)
    pool = load_head(d / "tiny-cold", ramp).pool
    fitted = LinearHead(rng.standard_normal((10, 32)).astype(np.float32),
                        rng.standard_normal(10).astype(np.float32), pool)
    file, _ = save_head(d / "tiny-cold", ramp, 1, fitted)
    back = load_head(d / "tiny-cold", ramp, file)
    np.testing.assert_array_equal(back.weight, fitted.weight)
    np.testing.assert_array_equal(back.bias, fitted.bias)


def test_no_ramp_starts_active(models, store):
    d, _ = models
    cold = Manifest.load(d / "tiny-cold")
    assert initial_ramps(cold, budget=100.0) == []
    assert initial_ramps(Manifest.load(d / "tiny"), budget=100.0) == [0, 1, 2]
    register_prepared(store, d / "tiny-cold", 100.0)
    config = store.latest_exit_config("tiny-cold")
    assert config.active == [] and set(config.thresholds) == {0, 1, 2}
    assert "3 untrained" in config.reason


def test_second_prepare_is_a_cache_hit_and_the_bootstrapped_copy_is_untouched(models):
    d, warm_mtimes = models
    cold = d / "tiny-cold"
    before = Manifest.load(cold).version
    mtimes = {p.name: p.stat().st_mtime_ns for p in cold.iterdir()}
    logs: list[str] = []
    prepare("tiny", d, log=logs.append, progress=quiet, name="tiny-cold", bootstrap=False)
    assert any(line.startswith("reusing tiny-cold") for line in logs), logs
    assert Manifest.load(cold).version == before
    assert {p.name: p.stat().st_mtime_ns for p in cold.iterdir()} == mtimes
    assert {p.name: p.stat().st_mtime_ns for p in (d / "tiny").iterdir()} == warm_mtimes
    logs.clear()
    prepare("tiny", d, log=logs.append, progress=quiet)
    assert any(line.startswith("reusing tiny ") for line in logs), logs


def full_model(models) -> str:
    d, _ = models
    return str(d / "tiny" / Manifest.load(d / "tiny").meta["full_model_file"])


def test_the_flag_is_part_of_the_cache_key(tmp_path, tiny_dir):
    """Under one name, the other kind of copy is rebuilt, never reused."""
    d = copy_of(tiny_dir, tmp_path)
    logs: list[str] = []
    prepare("tiny", d, log=logs.append, progress=quiet, bootstrap=False)
    assert any("prepared by another recipe; rebuilding" in line for line in logs), logs
    m = Manifest.load(d / "tiny")
    assert m.bootstrap is False and not any(r.trained for r in m.ramps)
    logs.clear()
    prepare("tiny", d, log=logs.append, progress=quiet, bootstrap_n=300)  # few: fast
    assert any("prepared by another recipe; rebuilding" in line for line in logs), logs
    m = Manifest.load(d / "tiny")
    assert m.bootstrap is True and all(r.trained for r in m.ramps)


@pytest.mark.parametrize("kwargs, said", [
    ({"bootstrap_n": 500}, "--bootstrap-n"),
    ({"ramp_targets": "softmax"}, "--ramp-targets"),
    ({"name": "chain-cnn"}, "zoo model's name"),
    ({"name": "../elsewhere"}, "plain name"),
])
def test_choices_that_make_no_sense_are_refused(tmp_path, kwargs, said):
    with pytest.raises(SourceError, match=said):
        prepare("tiny", tmp_path, log=quiet, progress=quiet, bootstrap=False, **kwargs)
    assert not list(tmp_path.iterdir())  # refused before any work


def test_a_users_model_needs_only_a_few_inputs(tmp_path, models):
    full = full_model(models)
    data = tmp_path / "few.npy"
    np.save(data, np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32))
    with pytest.raises(SourceError, match="at least 200"):
        prepare(full, tmp_path / "m", log=quiet, progress=quiet, data=data, name="mine")
    with pytest.raises(SourceError, match="a few sample inputs"):
        prepare(full, tmp_path / "m", log=quiet, progress=quiet, name="mine",
                bootstrap=False)
    path = prepare(full, tmp_path / "m", log=quiet, progress=quiet, data=data,
                   name="mine", bootstrap=False)
    m = Manifest.load(path)
    assert m.name == "mine" and not m.bootstrap and len(m.ramps) == 3
    assert all(not r.trained for r in m.ramps)
