"""How a ramp pools its site's activation into the features its linear layer reads: the
numpy twin of the exported heads' pooling (``services.prepare.ramps.RampHead``), for
feature feedback and replay traces."""

from __future__ import annotations

import numpy as np

POOLS = ("gap", "mean", "first", "masked_mean")
# a head's ``arch`` (``prepare.ramps.arch_name``) -> its pooling
POOL_OF_ARCH = {"gap_fc": "gap", "mean_fc": "mean", "first_fc": "first",
                "mmean_fc": "masked_mean", "fc": "gap"}


def pool_np(x: np.ndarray, pool: str = "gap", mask: np.ndarray | None = None) -> np.ndarray:
    """N×C×H×W -> N×C by global average; N×S×H -> N×H by mean, first token or mean over
    the tokens ``mask`` (N×S) marks; N×C as is."""
    if x.ndim == 4:
        return x.mean(axis=(2, 3))
    if x.ndim == 3:
        if pool == "masked_mean":
            if mask is None:
                raise ValueError("masked_mean pooling needs the attention mask")
            m = np.asarray(mask, np.float32)[:, :, None]
            return (x * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)
        return x[:, 0] if pool == "first" else x.mean(axis=1)
    if x.ndim == 2:
        return x
    raise ValueError(f"cannot pool activations of shape {x.shape}")


def pool_of_arch(arch: str) -> str:
    """The pooling of a ramp head of architecture ``arch``; ValueError if unknown."""
    try:
        return POOL_OF_ARCH[arch]
    except KeyError:
        raise ValueError(f"unknown ramp architecture {arch!r}; known: "
                         f"{', '.join(POOL_OF_ARCH)}") from None
