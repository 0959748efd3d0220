"""The manifest of a prepared model: ``<models_dir>/<name>/manifest.json``.

A prepared model is a chain of ONNX blocks cut from the model's graph at its ramp sites,
plus ONNX ramp heads. Block 0 takes the model inputs by name; block k > 0 takes the
activation of site k-1 (its first input, named as in the original graph) plus any model
inputs it reads (e.g. BERT's ``attention_mask``); the last block outputs the final
logits. A ramp head takes ``x`` (the output of block ``after_block``) and outputs
``logits``. Every file carries a dynamic batch axis 0 and is named after its content
hash, so a manifest and its files never disagree.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

MANIFEST_FILE = "manifest.json"


def manifest_kind(model_dir: Path) -> str | None:
    """The ``kind`` a prepared model's manifest declares ("" for the zoo's classifiers,
    "supernet", "llm"), None when the folder holds no manifest."""
    try:
        return str(read_manifest(model_dir).get("kind") or "")
    except ModelNotPrepared:
        return None


class ModelNotPrepared(FileNotFoundError):
    """No manifest where a prepared model should be; the message names the fix."""


def read_manifest(model_dir: Path) -> dict[str, Any]:
    """The manifest document of the model prepared at ``model_dir``."""
    path = Path(model_dir) / MANIFEST_FILE
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        name = Path(model_dir).name
        raise ModelNotPrepared(f"{name} is not prepared under {Path(model_dir).parent} "
                               f"(run `offramp prepare {name}`)") from None


def write_manifest(model_dir: Path, doc: dict[str, Any]) -> Path:
    """Write a manifest atomically and durably: readers see the old one or the new one,
    never half, and a crash right after leaves the new one on disk."""
    path = Path(model_dir) / MANIFEST_FILE
    tmp = path.with_name(f".{MANIFEST_FILE}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    # Tolerate keys written by a newer version instead of failing to load.
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype string, e.g. "<f4"
    shape: list[int]  # without the batch axis; -1 = variable

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorSpec:
        return cls(name=d["name"], dtype=d["dtype"], shape=[int(s) for s in d["shape"]])


@dataclass(frozen=True)
class BlockSpec:
    index: int
    file: str
    sha256: str
    input_names: list[str]
    output_shape: list[int]  # without the batch axis
    cost_ms: float = 0.0  # measured batch-1 latency of this block alone
    output_name: str = "y"  # the site tensor (or final output) this block produces
    cost_by_batch: dict[str, float] = field(default_factory=dict)  # batch size -> ms

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BlockSpec:
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class RampSpec:
    index: int
    after_block: int
    file: str
    sha256: str
    arch: str  # "gap_fc": global average pool + linear
    params: int
    agreement: float | None  # held-out top-1 agreement with the final model; None: untrained
    cost_ms: float  # measured batch-1 latency of the ramp head
    site: str = ""  # the graph tensor the ramp reads (its cut vertex)
    cost_by_batch: dict[str, float] = field(default_factory=dict)  # batch size -> ms
    # What a worker pays (batch 1, ms; 0 = not measured): the merged block range from the
    # input to this site, and activating the ramp (its stage splits here + the fused head),
    # over the unsplit range. ``services.exits.exit_window.LatencyProfile.from_manifest``.
    prefix_ms: float = 0.0
    serve_ms: float = 0.0
    # Model inputs the head reads besides the site activation, fed by name (a text model's
    # attention mask, for a mean over real tokens only).
    inputs: list[str] = field(default_factory=list)
    # False: a placeholder head (zero weights: a uniform softmax, never confident) that no
    # initial deployment activates; a live refit gives it weights. Older manifests: trained.
    trained: bool = True

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RampSpec:
        return cls(**_known(cls, d))


@dataclass
class Manifest:
    name: str
    version: str
    kind: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    classes: int
    blocks: list[BlockSpec]
    ramps: list[RampSpec]
    base_params: int
    full_ms: float
    meta: dict[str, Any] = field(default_factory=dict)  # provenance: data, timings
    # False: prepared without bootstrap data (``offramp prepare --no-bootstrap``), every
    # ramp untrained. Older manifests lack the key: bootstrapped.
    bootstrap: bool = True

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def ramp(self, index: int) -> RampSpec:
        for r in self.ramps:
            if r.index == index:
                return r
        raise KeyError(f"{self.name} has no ramp {index}")

    def model_inputs_of(self, first_block: int, last_block: int) -> list[str]:
        """Model inputs (not activations) that blocks [first_block, last_block) and their
        ramps read."""
        names = {t.name for t in self.inputs}
        out: list[str] = []
        for b in self.blocks[first_block:last_block]:
            out += [n for n in b.input_names if n in names and n not in out]
        for r in self.ramps_in(first_block, last_block):
            out += [n for n in r.inputs if n in names and n not in out]
        return out

    def ramps_in(self, first_block: int, last_block: int) -> list[RampSpec]:
        """Ramps a stage running blocks [first_block, last_block) evaluates."""
        return [r for r in self.ramps if first_block <= r.after_block < last_block]

    def artifacts(self) -> list[tuple[str, str]]:
        """(file, sha256) of every artifact, blocks first."""
        return [(b.file, b.sha256) for b in self.blocks] + [(r.file, r.sha256) for r in self.ramps]

    def compute_version(self) -> str:
        h = hashlib.sha256()
        for file, digest in self.artifacts():
            h.update(f"{file}:{digest}\n".encode())
        return h.hexdigest()[:16]

    def verify(self, model_dir: Path, check_hash: bool = True) -> list[str]:
        """Problems with the files on disk (empty when complete and intact)."""
        problems = []
        if self.version != self.compute_version():
            problems.append("version does not match artifact hashes")
        for file, digest in self.artifacts():
            path = Path(model_dir) / file
            if not path.is_file():
                problems.append(f"missing {file}")
            elif check_hash and sha256_file(path) != digest:
                problems.append(f"hash mismatch {file}")
        return problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        return cls(
            name=d["name"],
            version=d["version"],
            kind=d["kind"],
            inputs=[TensorSpec.from_dict(t) for t in d["inputs"]],
            outputs=[TensorSpec.from_dict(t) for t in d["outputs"]],
            classes=int(d["classes"]),
            blocks=[BlockSpec.from_dict(b) for b in d["blocks"]],
            ramps=[RampSpec.from_dict(r) for r in d["ramps"]],
            base_params=int(d["base_params"]),
            full_ms=float(d["full_ms"]),
            meta=dict(d.get("meta", {})),
            bootstrap=bool(d.get("bootstrap", True)),
        )

    @classmethod
    def load(cls, model_dir: Path) -> Manifest:
        return cls.from_dict(read_manifest(model_dir))

    def save(self, model_dir: Path) -> Path:
        return write_manifest(model_dir, self.to_dict())
