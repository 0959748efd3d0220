"""The torch runtime of a supernet model (SuperServe §3): one copy of the weights, and the
subnet a batch names run in place (SubNetAct), no reload.

It answers the calls a worker makes of a stage runtime for a model with one block and no
ramps (``run_range`` runs the whole model), so the worker's batching, answering and
telemetry serve it unchanged; ``variant`` is the extra argument. A batch without a variant
runs the largest subnet, the model as trained. A variant that is not a subnet of this
supernet, or one whose normalization statistics were not prepared (not on the frontier),
is refused with ``bad_request``: serving an uncalibrated subnet would be silently wrong.
"""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import numpy as np
import torch

from schemas import errors
from schemas.errors import ServingError
from services.runtime.manifest import Manifest
from services.supernet.conv_supernet import ConvArch, ConvSupernet
from services.supernet.operators import norms
from services.supernet.subnet import Subnet, parse_subnet

PROVIDER = "torch-cpu"


def load_supernet(model_dir: Path, manifest: Manifest) -> ConvSupernet:
    block = manifest.blocks[0]
    data = (Path(model_dir) / block.file).read_bytes()
    payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    arch = payload["arch"]
    net = ConvSupernet(ConvArch(**{k: tuple(v) if isinstance(v, list) else v
                                   for k, v in arch.items()}))
    net.load_state_dict(payload["state"])
    for norm, stats in zip(norms(net), payload["norms"], strict=True):
        norm.stats = {k: (v[0], v[1]) for k, v in stats.items()}
    for p in net.parameters():
        p.requires_grad_(False)
    return net.eval()


class SupernetRuntime:
    def __init__(self, model_dir: Path, manifest: Manifest, first_block: int = 0,
                 last_block: int = 1, threads: int = 0) -> None:
        if (first_block, last_block) != (0, 1):
            raise ValueError(f"{manifest.name} is a supernet: one stage, blocks 0:1 only")
        self.manifest = manifest
        self.first_block, self.last_block = 0, 1
        self.net = load_supernet(model_dir, manifest)
        self.largest = self.net.space.largest
        if threads > 0:  # per process, once: a worker process serves one runtime
            torch.set_num_threads(threads)
        self.providers = [PROVIDER]
        self.tap_notes: list[str] = []
        self._known: dict[str, Subnet] = {}

    @property
    def variants(self) -> list[str]:
        """The subnets this runtime serves (those with normalization statistics)."""
        return sorted(norms(self.net)[0].stats)

    def subnet(self, variant: str | None) -> Subnet:
        if variant is None:
            return self.largest
        got = self._known.get(variant)
        if got is not None:
            return got
        try:
            subnet = self.net.space.check(parse_subnet(variant))
        except ValueError as exc:
            raise ServingError(errors.BAD_REQUEST, f"variant {variant!r}: {exc}") from None
        if subnet.key not in norms(self.net)[0].stats:
            raise ServingError(errors.BAD_REQUEST, f"variant {variant!r} is not served by "
                               f"{self.manifest.name}: only its profiled frontier is "
                               f"({len(self.variants)} subnets)")
        self._known[variant] = subnet
        return subnet

    def run_range(self, start: int, end: int, x, model_inputs=None, ramp=None,
                  heads=None, features=None, variant: str | None = None):
        """The whole model on ``x`` (the model inputs) under ``variant``: (logits, None)."""
        subnet = self.subnet(variant)
        image = x["image"] if isinstance(x, dict) else x
        with torch.no_grad():
            logits = self.net(torch.from_numpy(np.ascontiguousarray(image)), subnet)
        return logits.numpy(), None

    def actuation_ms(self, variant: str, repeats: int = 1000) -> float:
        """What switching the next batch to ``variant`` costs before its forward pass: the
        check of the control tuple (SubNetAct needs no reload), median over ``repeats``."""
        self._known.pop(variant, None)
        times = []
        for _ in range(repeats):
            self._known.pop(variant, None)
            t0 = time.perf_counter()
            self.subnet(variant)
            times.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(times))

    # what the worker asks of any stage runtime; a supernet has no ramps or taps
    def warm(self, active=(), heads=None, features=False, split=False) -> None:
        shape = (1, *self.manifest.inputs[0].shape)
        self.run_range(0, 1, np.zeros(shape, np.float32))

    def preload_taps(self) -> None:
        return None

    def forget_heads(self, keep) -> None:
        return None

    @contextlib.contextmanager
    def interruptible(self):
        yield None
