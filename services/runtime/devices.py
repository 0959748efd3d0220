"""Where a model runs: ONNX Runtime execution providers (CUDA when a GPU is really there,
else CPU) and the device class that makes latency profiles comparable."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import onnxruntime as ort

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


def device_class(device: str = "auto", providers: list[str] | None = None,
                 threads: int = 0) -> str:
    """Profiles are only comparable on like hardware: "cpu-<cores>c", or the GPU's name
    when ONNX Runtime runs on CUDA (``providers``: those a session really got, else the
    ones ``device`` asks for). On CPU a worker limited to ``threads`` intra-op threads
    (``OFFRAMP_ORT_THREADS``) is a class of its own, "cpu-<cores>c-<threads>t": several
    such workers share the machine, and a profile taken on every core would promise each
    of them the whole of it."""
    providers = pick_providers(device) if providers is None else providers
    if providers and providers[0] == CUDA and gpu_present():
        return gpu_name() or "cuda"
    return f"cpu-{cores()}c" + (f"-{threads}t" if 0 < threads < cores() else "")


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use (containers, taskset)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def gpu_name() -> str | None:
    """Name of the first NVIDIA GPU, without importing torch or CUDA libraries."""
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model" and value.strip():
                return value.strip()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = [n.strip() for n in out.splitlines() if n.strip()]
    return names[0] if names else None
