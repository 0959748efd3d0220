"""ONNX Runtime sessions for one stage (a contiguous block range) of a prepared model."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort

from services.models.manifest import Manifest

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def gpu_present() -> bool:
    """True only when an NVIDIA driver is really there.

    onnxruntime-gpu lists CUDAExecutionProvider even on CPU-only machines and logs a
    load failure when asked for it, so the provider list alone proves nothing.
    """
    return os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia")


def pick_providers(device: str = "auto") -> list[str]:
    """Execution providers for ``device`` in {"auto", "cuda", "cpu"}."""
    device = device.lower()
    if device == "cpu":
        return [CPU]
    if device == "cuda":
        return [CUDA, CPU]
    if device == "auto":
        if gpu_present() and CUDA in ort.get_available_providers():
            return [CUDA, CPU]
        return [CPU]
    raise ValueError(f"unknown device {device!r}; use auto, cuda or cpu")


def session_options(threads: int = 0) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads > 0:
        so.intra_op_num_threads = threads
    so.log_severity_level = 3  # errors only: keep service logs readable
    # Idle intra-op threads otherwise spin-wait after each run, stealing the cores the
    # router, NATS and the other stages need on a small machine.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def block_ranges(first: int, last: int, cut_after: set[int]) -> list[tuple[int, int]]:
    """Blocks [first, last) as contiguous ranges ending after every block in ``cut_after``
    (the blocks followed by an active ramp): each range runs as one session."""
    cuts = sorted(b + 1 for b in cut_after if first <= b < last - 1)
    bounds = [first, *cuts, last]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


class StageRuntime:
    """Blocks [first_block, last_block) and the ramps after them, one session each."""

    def __init__(
        self,
        model_dir: Path,
        manifest: Manifest,
        first_block: int,
        last_block: int,
        device: str = "auto",
        threads: int = 0,
    ) -> None:
        if not 0 <= first_block < last_block <= manifest.num_blocks:
            raise ValueError(
                f"bad block range [{first_block}, {last_block}) for "
                f"{manifest.name} with {manifest.num_blocks} blocks"
            )
        self.model_dir = Path(model_dir)
        self.manifest = manifest
        self.first_block = first_block
        self.last_block = last_block
        so = session_options(threads)
        wanted = pick_providers(device)

        def load(file: str) -> ort.InferenceSession:
            return ort.InferenceSession(str(self.model_dir / file), so, providers=wanted)

        self._blocks = {b.index: load(b.file) for b in manifest.blocks[first_block:last_block]}
        self._so, self._providers = so, wanted
        self._merged: dict[tuple[int, int], ort.InferenceSession] = {}
        self._merge_lock = threading.Lock()
        self.ramps = manifest.ramps_in(first_block, last_block)
        self._ramps = {r.index: load(r.file) for r in self.ramps}
        self._in_dtypes = {t.name: np.dtype(t.dtype) for t in manifest.inputs}
        first = next(iter(self._blocks.values()))
        self.providers: list[str] = list(first.get_providers())

    @property
    def is_last(self) -> bool:
        return self.last_block == self.manifest.num_blocks

    def run_block(self, i: int, x: dict[str, np.ndarray] | np.ndarray,
                  model_inputs: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Output of block ``i``. Block 0 takes the model inputs (a dict, or one array for a
        single-input model); block k > 0 takes the previous activation ``x`` plus whatever
        model inputs it reads, looked up in ``model_inputs``."""
        spec = self.manifest.blocks[i]
        sess = self._blocks[i]
        if i == 0:
            if not isinstance(x, dict):
                if len(spec.input_names) != 1:
                    raise ValueError(f"block 0 needs a dict of inputs {spec.input_names}")
                x = {spec.input_names[0]: x}
            feeds = {k: self._model_input(k, x) for k in spec.input_names}
        else:
            act = x["x"] if isinstance(x, dict) else x
            feeds = {spec.input_names[0]: np.ascontiguousarray(act, dtype=np.float32)}
            for k in spec.input_names[1:]:
                if model_inputs is None or k not in model_inputs:
                    raise ValueError(f"block {i} of {self.manifest.name} also reads model "
                                     f"input {k!r}: pass it in model_inputs")
                feeds[k] = self._model_input(k, model_inputs)
        return sess.run(None, feeds)[0]

    def _model_input(self, name: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return np.ascontiguousarray(inputs[name], dtype=self._in_dtypes.get(name, np.float32))

    def run_range(self, start: int, end: int, x: dict[str, np.ndarray] | np.ndarray,
                  model_inputs: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Blocks [start, end) as one ONNX Runtime session: a stage runs the blocks between
        two active ramps in one call instead of one call per block (each call costs tens of
        microseconds, and ORT optimises across the merged graph)."""
        if end - start == 1:
            return self.run_block(start, x, model_inputs)
        sess = self.merged(start, end)
        if isinstance(x, dict):
            model_inputs = x if model_inputs is None else model_inputs
        feeds = {}
        for i in sess.get_inputs():
            if i.name in self._in_dtypes:
                if model_inputs is None or i.name not in model_inputs:
                    raise ValueError(f"blocks {start}..{end - 1} read model input {i.name!r}")
                feeds[i.name] = self._model_input(i.name, model_inputs)
            else:
                act = x["x"] if isinstance(x, dict) else x
                feeds[i.name] = np.ascontiguousarray(act, dtype=np.float32)
        return sess.run(None, feeds)[0]

    def merged(self, start: int, end: int) -> ort.InferenceSession:
        """The session for blocks [start, end), assembled from the block files on first use
        (thread-safe: a worker warms the ranges of a new exit config in a thread)."""
        key = (start, end)
        if key not in self._merged:
            with self._merge_lock:
                if key not in self._merged:
                    import onnx

                    from services.models.onnx_blocks import assemble

                    parts = [onnx.load(str(self.model_dir / b.file))
                             for b in self.manifest.blocks[start:end]]
                    model = assemble(parts, 0, len(parts))
                    self._merged[key] = ort.InferenceSession(
                        model.SerializeToString(), self._so, providers=self._providers)
        return self._merged[key]

    def warm(self, active_after: set[int]) -> None:
        """Build the merged sessions an exit config will need, before it is applied."""
        for a, b in block_ranges(self.first_block, self.last_block, active_after):
            if b - a > 1:
                self.merged(a, b)

    def run_ramp(self, r: int, x: np.ndarray) -> np.ndarray:
        """Logits of ramp ``r`` on the output of its block."""
        return self._ramps[r].run(None, {"x": np.ascontiguousarray(x, dtype=np.float32)})[0]

    def run_all(
        self, inputs: dict[str, np.ndarray] | np.ndarray,
        model_inputs: dict[str, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """Run every block of the stage; return its output and every ramp's logits."""
        by_block: dict[int, list[int]] = {}
        for r in self.ramps:
            by_block.setdefault(r.after_block, []).append(r.index)
        x: dict[str, np.ndarray] | np.ndarray = inputs
        if model_inputs is None and isinstance(inputs, dict):
            model_inputs = inputs
        ramp_logits: dict[int, np.ndarray] = {}
        for i in range(self.first_block, self.last_block):
            x = self.run_block(i, x, model_inputs)
            for r in by_block.get(i, []):
                ramp_logits[r] = self.run_ramp(r, x)
        assert isinstance(x, np.ndarray)
        return x, ramp_logits
