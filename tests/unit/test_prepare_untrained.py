"""Models prepared without bootstrap data (`offramp prepare --no-bootstrap`): the manifest
marks them, and no initial deployment activates their untrained ramps."""

import json
from dataclasses import replace

from services.cli.prepare import ramp_table
from services.exits.initial import initial_ramps
from services.runtime.manifest import BlockSpec, Manifest, RampSpec, TensorSpec


def model(trained: list[bool], bootstrap: bool = True) -> Manifest:
    """Four blocks of 1 ms, a ramp after each of the first three (0.01 ms to serve)."""
    blocks = [BlockSpec(i, f"b{i}", "", ["x"], [8], cost_ms=1.0) for i in range(4)]
    ramps = [RampSpec(k, k, f"r{k}", "", "fc", 90, 0.8 if t else None, 0.01,
                      prefix_ms=k + 1.0, serve_ms=0.01, trained=t)
             for k, t in enumerate(trained)]
    return Manifest("m", "v", "classifier", [TensorSpec("x", "<f4", [16])],
                    [TensorSpec("logits", "<f4", [10])], 10, blocks, ramps, 1000, 4.0,
                    meta={"range_ms": 4.0}, bootstrap=bootstrap)


def through_json(m: Manifest) -> Manifest:
    return Manifest.from_dict(json.loads(json.dumps(m.to_dict())))


def test_untrained_ramps_are_never_initially_active():
    assert initial_ramps(model([True] * 3), budget=100.0) == [0, 1, 2]
    assert initial_ramps(model([False] * 3, bootstrap=False), budget=100.0) == []
    assert initial_ramps(model([False] * 3, bootstrap=False), budget=0.0) == []
    # Should a model mix them, only the trained ramps are candidates.
    assert initial_ramps(model([False, True, False]), budget=100.0) == [1]
    assert initial_ramps(model([True, False, True]), budget=100.0) == [0, 2]


def test_manifest_round_trips_untrained_ramps():
    m = model([False] * 3, bootstrap=False)
    back = through_json(m)
    assert back == m
    assert back.bootstrap is False
    assert [(r.trained, r.agreement) for r in back.ramps] == [(False, None)] * 3


def test_old_manifests_load_as_trained():
    d = model([True] * 3).to_dict()
    del d["bootstrap"]
    for r in d["ramps"]:
        del r["trained"]
    old = Manifest.from_dict(json.loads(json.dumps(d)))
    assert old.bootstrap is True and all(r.trained for r in old.ramps)
    assert old == model([True] * 3)


def test_ramp_table_shows_untrained_ramps():
    m = model([False] * 3, bootstrap=False)
    ramps = [{"ramp": r.index, "site": r.index, "tensor": f"t{r.index}", "trained": r.trained,
              "agreement": r.agreement, "cost_ms": r.cost_ms, "cost_share": None,
              "cost_share_unsplit": None, "cost_share_unsplit_b16": None, "params_share": None,
              "serve_ms": r.serve_ms, "serve_share_unsplit": None} for r in m.ramps]
    table = ramp_table(m, {"sites": ramps, "ramps": ramps})
    assert "untrained: no bootstrap data" in table.splitlines()[0]
    rows = table.splitlines()[2:5]
    assert all("untrained" in row for row in rows), table
    trained = replace(m, bootstrap=True)
    ramps[0] = {**ramps[0], "trained": True, "agreement": 0.8125}
    table = ramp_table(trained, {"sites": ramps, "ramps": ramps})
    assert "untrained" not in table.splitlines()[0] and "0.812" in table.splitlines()[2]
