"""Latency profiles measured through StageRuntime on the prepared `tiny` model.

Only the shape of the result is checked: tests never assert on wall-clock speed."""

from __future__ import annotations

import re
from datetime import timedelta

from services.profiler.service import expected_keys, needs_profile
from services.runtime.devices import CPU, CUDA, device_class, gpu_present
from services.store.db import utcnow


def test_device_class_format() -> None:
    assert re.fullmatch(r"cpu-[1-9][0-9]*c", device_class("cpu"))
    assert device_class("auto", providers=[CPU]) == device_class("cpu")
    if not gpu_present():  # CUDA listed by onnxruntime-gpu but no driver: still a CPU
        assert device_class("auto") == device_class("cuda", [CUDA, CPU]) == device_class("cpu")
    else:
        assert device_class("cuda", [CUDA, CPU]) != device_class("cpu")


def test_needs_profile() -> None:
    manifest = {"blocks": [{"index": 0}, {"index": 1}], "ramps": [{"index": 0}]}
    now = utcnow()
    model = {"manifest": manifest, "updated_at": now - timedelta(minutes=1)}
    profile = [
        {"kind": k, "idx": i, "batch_size": b, "measured_at": now}
        for k, i, b in expected_keys(manifest, (1, 4))
    ]
    assert len(profile) == 8
    assert not needs_profile(model, profile, (1, 4))
    assert needs_profile(model, profile[1:], (1, 4))  # a part is missing
    assert needs_profile(model, profile, (1, 4, 16))  # a batch size is missing
    assert needs_profile({**model, "updated_at": now + timedelta(seconds=1)}, profile, (1, 4))
