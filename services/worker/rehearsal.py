"""A worker's rehearsal of a new split before it applies it: a few batches of placeholder
inputs through the very path its batches will take, so the first real ones do not pay the
runtime's cold start. Building a session is not enough: ONNX Runtime's first runs (and the
first at a larger batch) allocate and plan, and on a 2-core CPU EfficientNet-Lite0's first
batch of 16 took 1.6-1.8x its usual time, its second 1.2x, its first of 11 1.3x. A
compute-mode config with another active set splits the stage into new sessions; batches
go on under the old config while the new one rehearses at low priority."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from schemas.messages import ExitConfig
from services.runtime.manifest import Manifest
from services.worker.stage_exec import execute_compute

TEXT_LENGTH = 16  # tokens: a variable sequence axis is rehearsed at this length


def placeholder(spec_shape: Sequence[int], dtype: str, batch: int) -> np.ndarray:
    """A batch of ``batch`` placeholders of one tensor: ones for integers (pixels, a text
    model's ids and attention mask: a mask of zeros would attend to nothing), zeros
    otherwise; a variable axis (-1) at :data:`TEXT_LENGTH`."""
    shape = [batch] + [TEXT_LENGTH if s < 0 else int(s) for s in spec_shape]
    dt = np.dtype(dtype)
    return np.ones(shape, dt) if dt.kind in "iub" else np.zeros(shape, dt)


def stage_inputs(manifest: Manifest, first_block: int, batch: int
                 ) -> tuple[dict[str, np.ndarray] | np.ndarray, dict[str, np.ndarray]]:
    """What a stage starting at ``first_block`` is given for a batch of ``batch``: the model
    inputs (stage 0) or the previous block's activation, and the model inputs its blocks
    and ramps may read."""
    model_inputs = {t.name: placeholder(t.shape, t.dtype, batch) for t in manifest.inputs}
    if first_block == 0:
        return model_inputs, model_inputs
    before = manifest.blocks[first_block - 1]
    return placeholder(before.output_shape, "<f4", batch), model_inputs


def rehearsal_config(config: ExitConfig) -> ExitConfig:
    """``config`` with nothing exiting (threshold 0 is Apparate's "never"): every active
    ramp's head and every block run for every row, as on the slowest real batch."""
    return dataclasses.replace(config, thresholds={r: 0.0 for r in config.thresholds})


def rehearsal_sizes(max_batch: int) -> list[int]:
    """The batch sizes a worker rehearses, in order: its largest twice (the second run of
    a fresh session was still a fifth slow), then half of it and 1, which then fit in
    what the largest allocated."""
    return [max_batch, max_batch] + sorted({max(1, max_batch // 2), 1} - {max_batch},
                                          reverse=True)


def rehearse(runtime, manifest: Manifest, ramps, first_block: int, last_block: int,
             config: ExitConfig, batch_sizes: Sequence[int]) -> int:
    """Run the stage once per entry of ``batch_sizes`` on placeholders, split at
    ``config``'s active ramps as compute mode runs it; the answers go nowhere. Returns how
    many batches ran."""
    quiet = rehearsal_config(config)
    for b in batch_sizes:
        x, model_inputs = stage_inputs(manifest, first_block, b)
        execute_compute(runtime, ramps, first_block, last_block, x, np.full(b, -1, np.int32),
                        quiet, None, np.zeros(b, bool), model_inputs=model_inputs)
    return len(batch_sizes)
