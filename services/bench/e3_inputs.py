"""What ``offramp bench e3 --sim`` simulates with, built from the prepared model (I/O).

- **Measured CPU profile**: every block, every ramp head and the whole model at batch
  sizes 1, 2, 4, 8 and 16, measured with ``services.profiler.latency.measure`` (through
  ``StageRuntime``, the code stage workers run) on the model's real workload inputs, in
  ``PROFILE_PASSES`` passes keeping each part's fastest median (noise only adds time). The
  result is cached as JSON under ``$OFFRAMP_HOME/cache/e3/`` keyed by model version, device
  class and batch sizes, with the time it was measured; reruns reuse it.
- **Trace**: ``services.sim.trace.record_trace`` (what ``offramp trace record`` runs) over
  ``TRACE_SAMPLES`` inputs of the model's workload (images: the ``video`` stream; text:
  the held-out ``text`` stream; other zoo models: their sample inputs), workload seed
  ``TRACE_SEED`` (not the ramps' bootstrap seed); cached as ``.npz`` beside the profile.
- **Exit config**: every ramp active, thresholds tuned by the tuner's hill climb
  (``services.tuner.thresholds.tune``) to at most ``constraint`` (1 %) disagreement with
  the full model on the whole trace: what the live tuner converges to on a steady stream
  (it re-tunes on what it serves). As a check of how far that is from held-out data, the
  same climb on the first half is evaluated on the second half (reported, not used).
- **Modeled GPU class**: ``../shared/data/a40-ofa-resnet50.json`` beside the project
  (``GPU_CURVES``): the A40 forward-pass curve of the published OFA-ResNet50 subnet
  *nearest the model in compute* (multiply-accumulates per sample, log scale;
  :func:`nearest_subnet`), this machine's block and head times scaled at each batch size
  by A40 / this machine's whole model (``e3_policies.modeled_table``). Labelled modeled
  everywhere. Why by compute: how flat a GPU's batch curve is depends on how much of the
  GPU one sample's work fills, so a 0.1-GMAC CNN on the full OFA-ResNet50's curve (batch
  16 at 4.1x batch 1, a 7-GMAC network saturating the A40 by batch 4) would be modeled
  as saturating a GPU it leaves mostly idle. The model's MACs are counted on its ONNX
  blocks (``services.runtime.onnx_macs``); a subnet's are its FLOPs budget
  (``mflops_limit``, what the search filled to within 1 %), the smallest's
  (``SMALLEST_SUBNET_MMACS``) and the unbudgeted full network's (``FULL_SUBNET_MMACS``)
  counted from the dimensions the public file lists. ``--gpu-curve ID`` takes a subnet's
  curve by id instead (batch 16 at 1.6-4.1x batch 1 over the six).
- **--device-profile FILE** replaces that class. JSON, either measured-style tables::

      {"name": "my-gpu", "modeled": false, "cost_per_s": 1.0, "batch_sizes": [1, 4, 16],
       "block_ms": [[...per batch size...], ...one row per block],
       "head_ms": [[...], ...one row per ramp site, in ramp order]}

  or a whole-model batch curve to scale this machine's measured tables by (modeled)::

      {"name": "my-gpu", "cost_per_s": 1.0, "full_ms": {"1": 3.8, "4": 3.6, "16": 6.3}}

  either with an optional link between its stages (default: the constant below)::

      "link": {"ms_per_byte": 1e-6, "fixed_ms": 0.05, "per_device": true}

- **Transfers** between stages: activation bytes per sample at each ramp site (the
  site's block output, float32, the workload's sequence length for a variable axis) x
  ms per byte + a fixed cost per message, both as a link's occupancy. The measured CPU
  class uses this machine's bus, measured once (``services.bench.e3_bus``: NATS on
  loopback through the Python client the workers use). A modeled class uses a documented
  conservative constant, not a measurement, labelled modeled: ``MS_PER_BYTE`` (1 GB/s
  effective, a 10 Gb/s link at ~80 % after encoding and copies) and ``FIXED_MS`` per
  message; the CPU class falls back to it too when the bus cannot be measured.
- **Links per device or per cut.** A modeled or file class gives every device its own link
  (E3's cluster: servers on 10 Gb/s Ethernet, a NIC each), ``"per_device": false`` in a
  file's ``link`` makes it one shared channel per cut. The measured CPU class keeps one
  channel per cut: its bus is one NATS server on this machine.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.optimizer.block_costs import LatencyTable
from services.optimizer.splits import Transfer
from services.sim.e3_policies import modeled_table
from services.sim.trace import Trace

PROFILE_BATCHES = (1, 2, 4, 8, 16)
PROFILE_PASSES = 3
TRACE_SAMPLES = 4000
TRACE_SEED = 1
MS_PER_BYTE = 1e-6
FIXED_MS = 0.05
CONSTANT_LINK = (f"constant, modeled (not measured): {1e-6 / MS_PER_BYTE:g} GB/s effective, "
                 f"{FIXED_MS} ms per message")
# the reference data beside the project (``../shared/data``, see its README)
GPU_CURVES = Path(__file__).resolve().parents[3] / "shared" / "data" / "a40-ofa-resnet50.json"
GPU_CLASS = "a40-modeled"
# Multiply-accumulates of the two published subnets without a FLOPs budget, counted (ad hoc,
# OFA's ResNet50 layer formulas) from the dimensions listed in the public file the curves
# come from; the same count gives subnet 4's published 3,999.5 MMACs exactly and subnet 1's
# 1,487.9 within 4.2 %.
SMALLEST_SUBNET_MMACS = 962.0  # subnet 0: depth 0, expand 0.2, width 0.65 everywhere
FULL_SUBNET_MMACS = 7491.6  # subnet 5: the largest (depth 2, expand 0.35, width 1.0)

Say = Callable[[str], None]


def say_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ClassProfile:
    """A device class the bench simulates on: its table, and where it came from."""

    name: str
    table: LatencyTable
    modeled: bool
    source: str
    cost_per_s: float = 1.0
    ratio: dict[int, float] | None = None  # modeled: reference / measured whole model
    link: tuple[float, float, str] = (MS_PER_BYTE, FIXED_MS, CONSTANT_LINK)  # per byte, fixed
    per_device_links: bool = True  # a link per device (False: one channel per cut)

    def transfer(self, bytes_per_sample: tuple[float, ...]) -> Transfer:
        return Transfer(bytes_per_sample, self.link[0], self.link[1], self.per_device_links)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "modeled": self.modeled, "source": self.source,
                "cost_per_s": self.cost_per_s, "batch_sizes": list(self.table.batch_sizes),
                "link": {"ms_per_byte": self.link[0], "fixed_ms": self.link[1],
                         "source": self.link[2],
                         "per_device": self.per_device_links},
                "full_ms": {str(b): round(float(self.table.blocks_at(b).sum()), 4)
                            for b in self.table.batch_sizes},
                **({"scale_by_batch": {str(b): round(r, 4) for b, r in self.ratio.items()}}
                   if self.ratio else {})}


def workload_of(manifest) -> str:
    names = {t.name for t in manifest.inputs}
    if names == {"input_ids", "attention_mask"}:
        return "text"
    if len(manifest.inputs) == 1 and len(manifest.inputs[0].shape) == 3:
        return "video"
    return "zoo"


def model_inputs(manifest, n: int, seed: int) -> tuple[Iterator[dict[str, np.ndarray]], dict]:
    """Chunks of ``n`` real inputs of the model's workload, and what describes them."""
    from services.sim.workload_inputs import CHUNK, workload_chunks

    wl = workload_of(manifest)
    if wl != "zoo":
        return workload_chunks(manifest, wl, n, seed, None)
    from services.zoo.registry import sample_inputs

    data = sample_inputs(manifest.name, n, seed)
    chunks = ({k: v[s:s + CHUNK] for k, v in data.items()} for s in range(0, n, CHUNK))
    return chunks, {"workload": "zoo sample inputs"}


def cache_dir() -> Path:
    from services.common import config

    d = config.load().home / "cache" / "e3"
    d.mkdir(parents=True, exist_ok=True)
    return d


def measured_profile(model_dir: Path, manifest, say: Say = say_stderr,
                     batches: tuple[int, ...] = PROFILE_BATCHES,
                     passes: int | None = None) -> dict[str, Any]:
    """The measured CPU profile (cached; see the module docstring)."""
    from services.runtime.devices import device_class

    passes = PROFILE_PASSES if passes is None else passes
    cls = device_class("cpu")
    sizes = "-".join(str(b) for b in batches)
    path = cache_dir() / f"profile-{manifest.name}-{manifest.version}-{cls}-b{sizes}.json"
    if path.is_file():
        doc = json.loads(path.read_text())
        say(f"CPU profile of {manifest.name} on {cls}: measured {doc['measured_at']} "
            f"(cached in {path})")
        return doc | {"cache": str(path), "cached": True}
    chunks, about = model_inputs(manifest, max(batches), TRACE_SEED)
    feed = next(iter(chunks))
    say(f"measuring {manifest.name} on {cls} at batch sizes {list(batches)}: every block, "
        f"ramp head and the whole model, {about['workload']} inputs, {passes} passes ...")
    load = [os.getloadavg()[0]]
    rows = _fastest_pass(model_dir, manifest, batches, feed, passes, load)
    doc = {"model": manifest.name, "model_version": manifest.version, "device_class": cls,
           "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           "batch_sizes": list(batches), "inputs": about, "rows": rows,
           "load_avg_1m": load, "passes": passes,
           "how": "services.profiler.latency.measure (StageRuntime; median of timed runs), "
                  f"{passes} passes, the fastest pass's median per part (a shared machine's "
                  "noise only adds time)"}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    say(f"measured {manifest.name} on {cls} at {doc['measured_at']}; cached in {path}")
    return doc | {"cache": str(path), "cached": False}


def _fastest_pass(model_dir: Path, manifest, batches: tuple[int, ...],
                  feed: dict[str, np.ndarray], passes: int, load: list[float]) -> list[dict]:
    from services.profiler.latency import measure

    best: dict[tuple, dict] = {}
    for _ in range(passes):
        for r in measure(model_dir, manifest, batches, device="cpu",
                         inputs=lambda b: {k: v[:b] for k, v in feed.items()}):
            key = (r["kind"], r["idx"], r["batch_size"])
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
        load.append(os.getloadavg()[0])
    return list(best.values())


def profile_table(doc: dict[str, Any], n_blocks: int,
                  ramp_ids: list[int]) -> tuple[LatencyTable, dict[int, float]]:
    """The measured rows as a latency table (heads in ``ramp_ids`` order) and the
    whole-model time by batch size."""
    sizes = tuple(doc["batch_sizes"])
    ms = {(r["kind"], r["idx"], r["batch_size"]): float(r["ms"]) for r in doc["rows"]}
    blocks = [[ms[("block", k, b)] for b in sizes] for k in range(n_blocks)]
    heads = [[ms[("ramp", r, b)] for b in sizes] for r in ramp_ids]
    full = {b: ms[("full", -1, b)] for b in sizes}
    return LatencyTable.build(sizes, blocks, heads), full


def subnet_mmacs(sub: dict[str, Any]) -> float:
    """A published subnet's compute, MMACs per sample (see the module docstring)."""
    limit = sub.get("mflops_limit")
    if limit is None:
        return FULL_SUBNET_MMACS
    return float(limit) if limit > 0 else SMALLEST_SUBNET_MMACS


def nearest_subnet(subnets: list[dict[str, Any]], model_mmacs: float) -> dict[str, Any]:
    """The subnet whose compute is nearest ``model_mmacs`` on a log scale (ties: the
    larger, whose curve is the steeper and so the less generous to E3). A model without
    counted compute is below every subnet: the smallest."""
    m = max(model_mmacs, 1e-9)
    return min(subnets, key=lambda s: (abs(math.log(subnet_mmacs(s) / m)), -subnet_mmacs(s)))


def gpu_class(cpu: LatencyTable, cpu_full: dict[int, float], path: Path = GPU_CURVES,
              subnet: int | None = None, model_mmacs: float | None = None) -> ClassProfile:
    """The modeled A40 class (see the module docstring): the curve of ``subnet`` (the
    file's subnet id, ``--gpu-curve``), else of the subnet nearest ``model_mmacs``, else
    (neither given) of the full network."""
    if not path.is_file():
        raise ValueError(f"no GPU batch curves at {path}: give a class with "
                         "--device-profile FILE")
    doc = json.loads(path.read_text())
    if subnet is not None:
        sub = next((s for s in doc["subnets"] if s["id"] == subnet), None)
        if sub is None:
            raise ValueError(f"--gpu-curve {subnet}: {path.name} has subnets "
                             f"{[s['id'] for s in doc['subnets']]}")
        why = f"subnet {subnet} as asked (--gpu-curve)"
    elif model_mmacs is not None:
        sub = nearest_subnet(doc["subnets"], model_mmacs)
        why = (f"subnet {sub['id']} ({subnet_mmacs(sub):,.0f} MMACs), the nearest in compute "
               f"to the model's {model_mmacs:,.1f} MMACs per sample")
    else:
        sub = max(doc["subnets"], key=subnet_mmacs)
        why = f"subnet {sub['id']}, the full network"
    curve = {int(b): float(v) for b, v in sub["forward_ms"].items()}
    table, ratio = modeled_table(cpu, cpu_full, curve)
    src = (f"modeled: this machine's measured block/head times x (A40 forward_ms of OFA-ResNet50 "
           f"subnet {sub['id']} / this machine's measured whole model) per batch size, from "
           f"{path.name} ({doc['device']}); {why}")
    name = GPU_CLASS if subnet is None else f"a40-subnet{subnet}-modeled"
    return ClassProfile(name, table, True, src, 1.0, ratio)


def file_class(path: Path, cpu: LatencyTable, cpu_full: dict[int, float]) -> ClassProfile:
    """A class from ``--device-profile FILE`` (format in the module docstring)."""
    try:
        return _file_class(json.loads(Path(path).read_text()), path, cpu, cpu_full)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a device class description ({exc!r}); see "
                         "services/bench/e3_inputs.py for the format") from None


def _file_class(doc: dict[str, Any], path: Path, cpu: LatencyTable,
                cpu_full: dict[int, float]) -> ClassProfile:
    name, cost = str(doc.get("name") or Path(path).stem), float(doc.get("cost_per_s", 1.0))
    link = (MS_PER_BYTE, FIXED_MS, CONSTANT_LINK)
    per_device = bool(doc.get("link", {}).get("per_device", True))
    if "link" in doc:
        link = (float(doc["link"]["ms_per_byte"]), float(doc["link"]["fixed_ms"]),
                f"from {path}")
    if "full_ms" in doc:
        curve = {int(b): float(v) for b, v in doc["full_ms"].items()}
        table, ratio = modeled_table(cpu, cpu_full, curve)
        return ClassProfile(name, table, True, f"modeled: this machine's tables scaled by the "
                            f"whole-model curve in {path}", cost, ratio, link, per_device)
    table = LatencyTable.build(doc["batch_sizes"], doc["block_ms"], doc["head_ms"])
    if table.n_blocks != cpu.n_blocks or table.n_sites != cpu.n_sites:
        raise ValueError(f"{path}: {table.n_blocks} blocks x {table.n_sites} heads, the model "
                         f"has {cpu.n_blocks} x {cpu.n_sites}")
    return ClassProfile(name, table, bool(doc.get("modeled", False)), f"tables from {path}",
                        cost, None, link, per_device)


def model_trace(model_dir: Path, manifest, say: Say = say_stderr, n: int | None = None,
                seed: int = TRACE_SEED) -> tuple[Trace, Path, bool]:
    """The model's trace over ``n`` inputs of its workload drawn with ``seed`` (cached; see
    the module docstring)."""
    from services.sim.trace import record_trace

    n = TRACE_SAMPLES if n is None else n
    path = cache_dir() / f"trace-{manifest.name}-{manifest.version}-n{n}-s{seed}.npz"
    if path.is_file():
        say(f"trace of {manifest.name}: {path} (cached)")
        return Trace.load(path), path, True
    chunks, about = model_inputs(manifest, n, seed)
    say(f"recording a trace of {manifest.name} over {n} {about['workload']} inputs "
        f"(seed {seed}) ...")
    tr = record_trace(model_dir, chunks, progress=say, total=n, device="cpu",
                      meta={"seed": seed, **about})
    tr.save(path)
    return tr, path, False


def tuned_thresholds(trace: Trace, constraint: float) -> tuple[np.ndarray, dict[str, Any]]:
    """Thresholds of every ramp tuned on the whole trace, and a held-out check."""
    from services.common import config
    from services.tuner import climb_native
    from services.tuner.thresholds import evaluate, tune

    climb = climb_native.best_climb(config.load().tuner_native)
    ids, n, prof = tuple(range(trace.n_sites)), trace.n_samples, trace.profile()
    res = tune(trace.window(ids), prof, constraint, climb=climb)
    half = tune(trace.window(ids, 0, n // 2), prof, constraint, climb=climb)
    check = evaluate(trace.window(ids, n // 2, n), prof, half.thresholds)
    th = np.array(res.thresholds, dtype=np.float64)
    return th, {"thresholds": [round(float(t), 6) for t in th], "tuned_on": n,
                "constraint": constraint, "agreement_on_trace": res.evaluation.agreement,
                "held_out_agreement": check.agreement,
                "how": "services.tuner.thresholds.tune, every ramp active, on the whole trace; "
                       "held_out_agreement: tuned on the first half, measured on the second"}


def activation_bytes(manifest, ramp_ids: list[int]) -> tuple[float, ...]:
    """Activation bytes per sample at each ramp site (float32 block outputs)."""
    shapes = [manifest.blocks[manifest.ramp(r).after_block].output_shape for r in ramp_ids]
    seq = seq_len_of(manifest) if any(d < 0 for s in shapes for d in s) else 1
    return tuple(4.0 * float(np.prod([seq if d < 0 else d for d in s])) for s in shapes)


def bus_link(say: Say = say_stderr) -> tuple[tuple[float, float, str], dict[str, Any]]:
    """This machine's bus as a link (ms per byte, fixed ms, source), measured once."""
    from services.bench.e3_bus import measured_bus

    try:
        doc = measured_bus(cache_dir())
    except Exception as exc:  # noqa: BLE001 - any failure: the documented constant
        say(f"could not measure the bus ({exc}); transfers use the constant: {CONSTANT_LINK}")
        return (MS_PER_BYTE, FIXED_MS, f"{CONSTANT_LINK}, the bus measurement failed"), {}
    when = "cached" if doc["cached"] else "measured"
    say(f"bus on this machine ({when} {doc['measured_at']}): {doc['fixed_ms']:.3f} ms per "
        f"message + {1e-6 / max(doc['ms_per_byte'], 1e-15):.2f} GB/s ({doc['cache']})")
    src = f"measured on this machine {doc['measured_at']}: {doc['how']}"
    return (doc["ms_per_byte"], doc["fixed_ms"], src), doc


def model_mmacs(model_dir: Path, manifest) -> float:
    """Multiply-accumulates per sample of the model's blocks, in millions, on one real
    input of its workload (``services.runtime.onnx_macs``)."""
    from services.runtime.onnx_macs import chain_macs

    chunks, _ = model_inputs(manifest, 1, TRACE_SEED)
    count = chain_macs(Path(model_dir), manifest, {k: v[:1] for k, v in next(iter(chunks)).items()})
    if count.unknown:
        raise ValueError(f"cannot count the compute of {manifest.name}: no shapes for "
                         f"{', '.join(count.unknown[:3])}; pick a curve with --gpu-curve ID")
    return count.macs / 1e6


def seq_len_of(manifest) -> int:
    """The workload's sequence length for a variable axis (text: the encoder's padding)."""
    chunks, _ = model_inputs(manifest, 2, TRACE_SEED)
    feed = next(iter(chunks))
    return int(max((v.shape[1] for v in feed.values() if v.ndim >= 2), default=1))
