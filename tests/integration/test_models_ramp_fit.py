"""Ramp-head fitting (services/prepare/ramps.py): the hand-written gradient and the fits."""

import numpy as np
import pytest
import torch

from services.prepare import ramps as rp


@pytest.mark.parametrize("soft", [False, True], ids=["one-hot", "probabilities"])
def test_loss_grads_match_autograd_of_the_documented_loss(soft):
    """Cross-entropy against one-hot labels or (distillation) a probability vector per row."""
    gen = torch.Generator().manual_seed(0)
    f, n, c, k, l2 = 3, 40, 7, 5, 0.02
    xs = torch.randn(f, n, c, generator=gen)
    w = torch.randn(f, k, c, generator=gen, requires_grad=True)
    b = torch.randn(f, k, generator=gen, requires_grad=True)
    y = torch.randint(0, k, (n,), generator=gen)
    target = (torch.softmax(torch.randn(n, k, generator=gen), dim=1) if soft
              else torch.nn.functional.one_hot(y, k).float())
    mask = (torch.rand(f, n, generator=gen) < 0.7).float()
    weight = (mask / mask.sum(dim=1, keepdim=True))[:, :, None]
    logits = torch.baddbmm(b[:, None, :], xs, w.transpose(1, 2))
    ce = -(target[None] * torch.log_softmax(logits, dim=2)).sum(dim=2)
    loss = (ce * weight[:, :, 0]).sum() + l2 * w.pow(2).sum(dim=2).mean(dim=1).sum()
    loss.backward()
    with torch.no_grad():
        gw, gb = rp.loss_grads(xs, w, b, target, weight, l2)
    assert torch.allclose(gw, w.grad, atol=1e-6)
    assert torch.allclose(gb, b.grad, atol=1e-6)


def test_softmax_targets_teach_the_final_models_doubt():
    """A top-1 fit is sure wherever the classes separate; a softmax fit stays unsure where
    the final model was (60/40), so a confident threshold lets few of those rows exit."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((600, 8)).astype(np.float32)
    doubt = x[:, 0] > 0                      # the final model hesitates on these rows
    logits = np.zeros((600, 3), np.float32)
    logits[:, 0] = np.where(doubt, np.log(0.6), 8.0)
    logits[:, 1] = np.where(doubt, np.log(0.4), 0.0)
    logits[:, 2] = -20.0                     # never seen: stays out of the fit
    y = logits.argmax(axis=1)
    (wh, bh), = rp.fit_linear(x, y, 3)
    (ws, bs), = rp.fit_linear(x, y, 3, soft=logits, steps=600)

    def top(w, b):
        z = x @ w.T + b
        p = np.exp(z - z.max(axis=1, keepdims=True))
        return (p / p.sum(axis=1, keepdims=True)).max(axis=1)
    sure_hard, sure_soft = top(wh, bh) > 0.9, top(ws, bs) > 0.9
    assert sure_hard[doubt].mean() > 0.9     # top-1: would exit almost every doubtful row
    assert sure_soft[doubt].mean() < 0.2     # softmax: holds most of them back
    assert sure_soft[~doubt].mean() > 0.6    # and still answers clear ones (a linear head
    assert rp.agreement(ws, bs, x, y) > 0.9  # cannot draw the step at x0 = 0 sharply)
    assert not ws[2].any() and bs[2] < bs[:2].min() - 10  # no mass anywhere: not fitted


def test_train_ramps_checks_its_targets():
    feats = rp.Features(by_block={0: np.zeros((10, 4), np.float32)}, ndims={0: 2},
                        labels=np.zeros(10, np.int64), groups=np.arange(10))
    with pytest.raises(ValueError, match="unknown ramp targets"):
        rp.train_ramps(feats, 2, targets="logits")
    with pytest.raises(ValueError, match="need the final model's logits"):
        rp.train_ramps(feats, 2, targets="softmax")


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


def test_ramp_targets_are_part_of_the_recipe():
    """A copy prepared with other ramp targets (or temperature) is rebuilt, not reused."""
    import onnx

    from services.prepare.pipeline import recipe_fingerprint
    from services.prepare.source import ModelSource

    def src(targets: str) -> ModelSource:
        return ModelSource(name="m", kind="classifier", description="", model=onnx.ModelProto(),
                           inputs=[], outputs=[], classes=2, base_params=0,
                           bootstrap=lambda n, s: iter(()), bootstrap_n=10,
                           sample=lambda n, s: {}, ramp_targets=targets)
    top1, soft = recipe_fingerprint(src("top1"), 10), recipe_fingerprint(src("softmax"), 10)
    assert top1 != soft and "targets=" not in top1  # top-1 copies made before stay valid
    assert f"softmax@{rp.SOFT_TEMPERATURE:g}" in soft


@pytest.mark.parametrize(("rows", "folds"), [(400, 5), (rp.ONE_FOLD_ROWS * 5, 1)])
def test_held_out_agreement_uses_one_fold_once_it_is_large(monkeypatch, rows, folds):
    """Five group folds estimate a small bootstrap's held-out agreement; a fold of
    ``ONE_FOLD_ROWS`` samples is estimate enough on its own, and saves four fits."""
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, rows)
    x = (np.eye(3)[y] * 2 + rng.standard_normal((rows, 3)) * 0.5).astype(np.float32)
    feats = rp.Features(by_block={0: x}, ndims={0: 2}, labels=y, groups=np.arange(rows) // 20)
    seen = []
    real = rp.fit_linear
    monkeypatch.setattr(rp, "fit_linear", lambda *a, **k: seen.append(len(a[3])) or real(*a, **k))
    fit, = rp.train_ramps(feats, 3, steps=30, log=lambda _m: None)
    assert len(fit.fold_agreement) == folds and seen == [folds + 1]  # folds + the exported fit
    assert 0.8 < fit.agreement <= 1.0
