"""``tiny``: a 5-layer MLP for overhead benchmarks and fast tests.

Input ``x`` float32[16]; four Linear+ReLU layers (hidden 32), then a Linear to 10
logits. Its graph has ramp sites after the first three ReLUs (the fourth only feeds the
classifier), so it prepares into 4 blocks and 3 ramps. Weights are seeded and briefly fitted to a fixed synthetic rule, so the
predictions are non-trivial (several classes, ramps that agree only partly) while
preparing still takes about a second.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from services.training.adam import Adam, torch_threads

IN_FEATURES = 16
HIDDEN = 32
CLASSES = 10
SEED = 1234


def rule_labels(x: np.ndarray) -> np.ndarray:
    """The synthetic target: a fixed nonlinear rule over the 16 inputs."""
    rng = np.random.default_rng(SEED)
    a = rng.normal(size=(IN_FEATURES, CLASSES)).astype(np.float32)
    b = rng.normal(size=(IN_FEATURES, CLASSES)).astype(np.float32)
    return (x @ a + np.sin(2.0 * (x @ b))).argmax(axis=1).astype(np.int64)


def sample_inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((n, IN_FEATURES), np.float32)}


def build_model(steps: int = 150) -> nn.Sequential:
    """The full model, deterministically fitted."""
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)  # nn.Linear init draws from the global generator
    blocks = [
        nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU()),
        nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU()),
        nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU()),
        nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU()),
        nn.Linear(HIDDEN, CLASSES),
    ]
    model = nn.Sequential(*blocks)
    x = torch.randn(4096, IN_FEATURES, generator=gen)
    y = torch.from_numpy(rule_labels(x.numpy()))
    opt = Adam(list(model.parameters()), lr=1e-2)
    with torch.enable_grad(), torch_threads(1):
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()
