"""A worker's rehearsal: placeholder batches through its own path before it takes work."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from schemas.messages import ExitConfig
from services.runtime.manifest import BlockSpec, Manifest, TensorSpec
from services.worker.rehearsal import (
    placeholder,
    rehearsal_config,
    rehearsal_sizes,
    rehearse,
    stage_inputs,
)


class RecordingRuntime:
    """Records each range it runs with the batch it got; ramp r answers class r."""

    def __init__(self):
        self.ranges: list[tuple[int, int, int, int | None]] = []

    def run_range(self, start, end, x, model_inputs=None, ramp=None):
        arr = next(iter(x.values())) if isinstance(x, dict) else x
        self.ranges.append((start, end, len(arr), ramp))
        out = np.zeros((len(arr), 2), np.float32)
        logits = None if ramp is None else np.eye(4, dtype=np.float32)[[ramp] * len(arr)] * 9
        return out, logits

    def run_ramp(self, r, x, model_inputs=None):
        return np.eye(4, dtype=np.float32)[[r] * len(x)] * 9


def manifest(inputs) -> Manifest:
    blocks = [BlockSpec(i, f"b{i}.onnx", "", ["x"], [8, 4, 4]) for i in range(3)]
    return Manifest("m", "v", "classifier", inputs, [], 4, blocks, [], 0, 1.0)


def test_placeholders_ones_for_integers_zeros_for_floats_and_text_length():
    ids = placeholder([-1], "<i8", 3)
    assert ids.shape == (3, 16) and ids.dtype == np.int64 and (ids == 1).all()
    img = placeholder([3, 8, 8], "|u1", 2)
    assert img.shape == (2, 3, 8, 8) and img.dtype == np.uint8 and (img == 1).all()
    act = placeholder([4], "<f4", 1)
    assert act.dtype == np.float32 and not act.any()


def test_stage_inputs_are_model_inputs_at_stage_0_and_the_activation_later():
    m = manifest([TensorSpec("input_ids", "<i8", [-1]), TensorSpec("attention_mask", "<i8", [-1])])
    x, inputs = stage_inputs(m, 0, 4)
    assert x is inputs and set(x) == {"input_ids", "attention_mask"}
    x, inputs = stage_inputs(m, 2, 4)
    assert x.shape == (4, 8, 4, 4) and x.dtype == np.float32   # block 1's output
    assert inputs["attention_mask"].shape == (4, 16)             # what later blocks read


def test_rehearsal_config_exits_nothing_and_keeps_the_rest():
    cfg = ExitConfig("m", 5, "compute", {0: 0.4, 1: 0.2}, [0, 1], heads={1: "h.onnx"})
    quiet = rehearsal_config(cfg)
    assert set(quiet.thresholds.values()) == {0.0}
    assert (quiet.version, quiet.mode, quiet.active, quiet.heads) == (5, "compute", [0, 1],
                                                                       {1: "h.onnx"})


def test_rehearsal_sizes_largest_twice_then_smaller():
    assert rehearsal_sizes(16) == [16, 16, 8, 1]
    assert rehearsal_sizes(2) == [2, 2, 1]
    assert rehearsal_sizes(1) == [1, 1]


def test_rehearse_runs_each_batch_size_in_order_through_the_split_path():
    ramps = [SimpleNamespace(index=0, after_block=0), SimpleNamespace(index=1, after_block=1)]
    cfg = ExitConfig("m", 1, "compute", {0: 0.9, 1: 0.9}, [0, 1])  # would exit every row
    rt = RecordingRuntime()
    m = manifest([TensorSpec("image", "|u1", [3, 8, 8])])
    assert rehearse(rt, m, ramps, 0, 3, cfg, (16, 1)) == 2
    # every range of the split path at 16, then at 1: nothing exited on the way
    assert rt.ranges == [(0, 1, 16, 0), (1, 2, 16, 1), (2, 3, 16, None),
                         (0, 1, 1, 0), (1, 2, 1, 1), (2, 3, 1, None)]


def test_rehearse_a_later_stage_from_its_first_block():
    ramps = [SimpleNamespace(index=1, after_block=1)]
    rt = RecordingRuntime()
    m = manifest([TensorSpec("image", "|u1", [3, 8, 8])])
    rehearse(rt, m, ramps, 1, 3, ExitConfig("m", 0, "compute", {1: 0.0}, [1]), (4,))
    assert rt.ranges == [(1, 2, 4, 1), (2, 3, 4, None)]


def test_a_worker_rehearses_only_a_compute_config_that_splits_its_stage_anew():
    from services.worker.service import Worker

    def ready(old: ExitConfig, new: ExitConfig) -> list[str]:
        calls: list[str] = []
        fake = SimpleNamespace(config=old, warm=lambda c: calls.append("warm"),
                               rehearse=lambda c: calls.append("rehearse"))
        Worker.ready_config(fake, new)
        return calls

    latency = ExitConfig("m", 1, "latency", {3: 0.0, 9: 0.0}, [3, 9])
    compute = ExitConfig("m", 2, "compute", {3: 0.0, 9: 0.0}, [9, 3])
    assert ready(latency, compute) == ["warm", "rehearse"]             # the mode changes
    assert ready(compute, ExitConfig("m", 3, "compute", {2: 0.0}, [2, 6])) == ["warm",
                                                                              "rehearse"]
    assert ready(compute, ExitConfig("m", 3, "compute", {3: 0.4}, [3, 9])) == ["warm"]
    assert ready(latency, ExitConfig("m", 2, "latency", {2: 0.0}, [2], heads={2: "h"})) == [
        "warm"]                                                        # latency mode: never
