"""Ramp-head fitting (services/models/ramps.py): the hand-written gradient and the fits."""

import numpy as np
import torch

from services.models import ramps as rp


def test_loss_grads_match_autograd_of_the_documented_loss():
    gen = torch.Generator().manual_seed(0)
    f, n, c, k, l2 = 3, 40, 7, 5, 0.02
    xs = torch.randn(f, n, c, generator=gen)
    w = torch.randn(f, k, c, generator=gen, requires_grad=True)
    b = torch.randn(f, k, generator=gen, requires_grad=True)
    y = torch.randint(0, k, (n,), generator=gen)
    mask = (torch.rand(f, n, generator=gen) < 0.7).float()
    weight = (mask / mask.sum(dim=1, keepdim=True))[:, :, None]
    logits = torch.baddbmm(b[:, None, :], xs, w.transpose(1, 2))
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, k), y.repeat(f),
                                           reduction="none").view(f, n)
    loss = (ce * weight[:, :, 0]).sum() + l2 * w.pow(2).sum(dim=2).mean(dim=1).sum()
    loss.backward()
    with torch.no_grad():
        gw, gb = rp.loss_grads(xs, w, b, torch.nn.functional.one_hot(y, k).float(), weight, l2)
    assert torch.allclose(gw, w.grad, atol=1e-6)
    assert torch.allclose(gb, b.grad, atol=1e-6)


def test_fit_linear_learns_each_mask_and_ignores_rows_outside_it():
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((4, 16)) * 3
    y = rng.integers(0, 4, 400) * 10          # 4 of 40 classes seen
    x = (centres[y // 10] + rng.standard_normal((400, 16))).astype(np.float32)
    first = np.arange(400) < 200
    garbage = y.copy()
    garbage[~first] = 30                      # rows outside the first mask lie
    (w1, b1), (w2, b2) = rp.fit_linear(x, garbage, 40, [first, np.ones(400, bool)])
    assert w1.shape == (40, 16) and b1.shape == (40,)
    assert rp.agreement(w1, b1, x[~first], y[~first]) > 0.97   # never saw the lies
    liars = ~first & (y != 30)
    said_30 = [float(((x[liars] @ w.T + b).argmax(axis=1) == 30).mean()) for w, b in ((w1, b1), (w2, b2))]
    assert said_30[0] < 0.03 and said_30[1] > 0.3              # the all-rows fit learned them
    unseen = [c for c in range(40) if c not in (0, 10, 20, 30)]
    assert (b1[unseen] < b1[[0, 10, 20, 30]].min()).all()      # absent classes never win


def test_masked_mean_head_and_features_average_real_tokens_only():
    """The exported head and the training features pool alike: padding never counts."""
    import pytest

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 5)).astype(np.float32)
    mask = (np.arange(6)[None, :] < np.array([[1], [3], [6], [2]])).astype(np.int64)
    feats = rp.pool_np(x, "masked_mean", mask)
    np.testing.assert_allclose(feats[1], x[1, :3].mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(feats[2], x[2].mean(axis=0), rtol=1e-6)
    head = rp.RampHead(5, 3, ndim=3, pool="masked_mean").eval()
    padded = x.copy()
    padded[mask == 0] = 50.0  # whatever sits at padded positions
    with torch.no_grad():
        got = head(torch.from_numpy(padded), torch.from_numpy(mask)).numpy()
        want = head.fc(torch.from_numpy(feats)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert rp.arch_name(3, "masked_mean") == "mmean_fc"
    with pytest.raises(ValueError, match="attention mask"):
        rp.pool_np(x, "masked_mean")
    with pytest.raises(ValueError, match="attention mask"):
        head(torch.from_numpy(x))
