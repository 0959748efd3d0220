"""EfficientNet-Lite0 split: torch segments always; ONNX files when already prepared.

Set OFFRAMP_MODELS_DIR to a folder holding a prepared efficientnet-lite0 (for example
after ``prepare("efficientnet-lite0", ...)``) to check the exported files too.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from services.models import efficientnet as eff
from services.models.manifest import Manifest
from services.models.workloads import photo_frame

NAME = "efficientnet-lite0"


@pytest.fixture(scope="session")
def model():
    return eff.load_model()


@pytest.fixture(scope="session")
def frames():
    return np.stack([photo_frame("chelsea"), photo_frame("coffee")])


@pytest.fixture(scope="session")
def prepared_dir(models_dir):
    # The shared fixture prepares the zoo (idempotent; ./dev.sh already did), so this runs always.
    d = Path(models_dir) / NAME
    return d


def test_segments_equal_unsplit_model(model, frames):
    x = torch.from_numpy(frames)
    segs = eff.segments(model)
    with torch.no_grad():
        ref = model(x)
        y = x
        for s in segs:
            y = s(y)
    assert len(segs) == len(eff.SITES) + 1
    assert torch.allclose(y, ref, atol=1e-5)
    assert not any(m.training for m in model.modules())


def test_real_photos_are_recognised(model, frames):
    with torch.no_grad():
        top1 = model(torch.from_numpy(frames)).argmax(1).tolist()
    assert 281 <= top1[0] <= 285  # chelsea: a cat
    assert top1[1] == 967  # coffee: espresso


def test_prepared_blocks_match_torch(prepared_dir, model, frames):
    from services.models.runtime import StageRuntime

    m = Manifest.load(prepared_dir)
    assert m.verify(prepared_dir) == []
    assert m.inputs[0].name == "image" and m.inputs[0].shape == [3, 224, 224]
    rt = StageRuntime(prepared_dir, m, 0, m.num_blocks, device="cpu")
    y, ramp_logits = rt.run_all({"image": frames})
    with torch.no_grad():
        ref = model(torch.from_numpy(frames)).numpy()
    np.testing.assert_allclose(y, ref, atol=1e-4)
    assert 281 <= y[0].argmax() <= 285 and y[1].argmax() == 967
    assert sorted(ramp_logits) == [r.index for r in m.ramps]
    for r in m.ramps:
        assert ramp_logits[r.index].shape == (2, 1000)
        assert r.arch == "gap_fc" and r.cost_ms > 0 and 0 < r.agreement <= 1
