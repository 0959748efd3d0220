"""The torch runtime of a supernet model (SuperServe §3): one copy of the weights, and the
subnet a batch names run in place (SubNetAct), no reload.

It answers the calls a worker makes of a stage runtime for a model with one block and no
ramps (``run_range`` runs the whole model), so the worker's batching, answering and
telemetry serve it unchanged; ``variant`` is the extra argument. A batch without a variant
runs the largest subnet, the model as trained. A variant that is not a subnet of this
supernet, or one whose normalization statistics were not prepared (not on the frontier),
is refused with ``bad_request``: serving an uncalibrated subnet would be silently wrong.

The manifest's ``meta.family`` says which supernet the artifact holds: ``conv`` (the
default, older manifests lack it; inputs ``image``) or ``transformer`` (a BERT supernet,
inputs ``input_ids`` and ``attention_mask``). A transformer needs no statistics, but is
served on its profiled frontier only too: the router never asks for anything else, and
a subnet nobody timed has no place in its latency table.
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
from services.supernet.bert_subnet import BertSubnet, parse_bert_subnet
from services.supernet.bert_supernet import BertArch, BertSupernet
from services.supernet.conv_supernet import ConvArch, ConvSupernet
from services.supernet.operators import norms
from services.supernet.subnet import Subnet, parse_subnet

PROVIDER = "torch-cpu"
# family -> (supernet class, its arch, the parser of its subnet keys, its model inputs)
FAMILIES = {"conv": (ConvSupernet, ConvArch, parse_subnet, ("image",)),
            "transformer": (BertSupernet, BertArch, parse_bert_subnet,
                            ("input_ids", "attention_mask"))}


def family(manifest: Manifest) -> str:
    got = manifest.meta.get("family", "conv")
    if got not in FAMILIES:
        raise ValueError(f"{manifest.name}: unknown supernet family {got!r}")
    return got


def load_supernet(model_dir: Path, manifest: Manifest):
    """(the supernet, eval mode and frozen; the subnet keys it serves)."""
    block = manifest.blocks[0]
    data = (Path(model_dir) / block.file).read_bytes()
    payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    cls, arch_cls, _, _ = FAMILIES[family(manifest)]
    net = cls(arch_cls(**{k: tuple(v) if isinstance(v, list) else v
                          for k, v in payload["arch"].items()}))
    net.load_state_dict(payload["state"])
    for norm, stats in zip(norms(net), payload["norms"], strict=True):
        norm.stats = {k: (v[0], v[1]) for k, v in stats.items()}
    for p in net.parameters():
        p.requires_grad_(False)
    # older conv artifacts name no served subnets: those with statistics are
    served = payload.get("served") or sorted(norms(net)[0].stats)
    return net.eval(), served


class SupernetRuntime:
    def __init__(self, model_dir: Path, manifest: Manifest, first_block: int = 0,
                 last_block: int = 1, threads: int = 0) -> None:
        if (first_block, last_block) != (0, 1):
            raise ValueError(f"{manifest.name} is a supernet: one stage, blocks 0:1 only")
        self.manifest = manifest
        self.first_block, self.last_block = 0, 1
        self.net, served = load_supernet(model_dir, manifest)
        _, _, self._parse, self.input_names = FAMILIES[family(manifest)]
        self._served = frozenset(served)
        self.largest = self.net.space.largest
        if threads > 0:  # per process, once: a worker process serves one runtime
            torch.set_num_threads(threads)
        self.providers = [PROVIDER]
        self.tap_notes: list[str] = []
        self._known: dict[str, Subnet | BertSubnet] = {}

    @property
    def variants(self) -> list[str]:
        """The subnets this runtime serves (its profiled frontier and the largest)."""
        return sorted(self._served)

    def subnet(self, variant: str | None) -> Subnet | BertSubnet:
        if variant is None:
            return self.largest
        got = self._known.get(variant)
        if got is not None:
            return got
        try:
            subnet = self.net.space.check(self._parse(variant))
        except ValueError as exc:
            raise ServingError(errors.BAD_REQUEST, f"variant {variant!r}: {exc}") from None
        if subnet.key not in self._served:
            raise ServingError(errors.BAD_REQUEST, f"variant {variant!r} is not served by "
                               f"{self.manifest.name}: only its profiled frontier is "
                               f"({len(self.variants)} subnets)")
        self._known[variant] = subnet
        return subnet

    def run_range(self, start: int, end: int, x, model_inputs=None, ramp=None,
                  heads=None, features=None, variant: str | None = None):
        """The whole model on ``x`` (the model inputs) under ``variant``: (logits, None)."""
        subnet = self.subnet(variant)
        if not isinstance(x, dict):
            x = {self.input_names[0]: x}
        try:
            feed = {k: torch.from_numpy(np.ascontiguousarray(x[k])) for k in self.input_names}
        except KeyError as exc:
            raise ServingError(errors.BAD_REQUEST, f"{self.manifest.name} needs inputs "
                               f"{', '.join(self.input_names)}; {exc} is missing") from None
        with torch.no_grad():   # a conv supernet takes its one tensor, a transformer all
            logits = self.net(feed if len(feed) > 1 else feed[self.input_names[0]], subnet)
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
        # ones: a real token everywhere for a text model (an all-padding row is no request)
        self.run_range(0, 1, {t.name: np.ones((1, *t.shape), np.dtype(t.dtype))
                              for t in self.manifest.inputs})

    def preload_taps(self) -> None:
        return None

    def forget_heads(self, keep) -> None:
        return None

    @contextlib.contextmanager
    def interruptible(self):
        yield None
