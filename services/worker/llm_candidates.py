"""The candidate an LLM worker holds, and another one read in the background when HELIOS
switches (``switch``, or ``evaluate`` of another candidate).

A worker serves one model's subject (``offramp.generate.<model>``) but may hold any prepared
candidate that shares the model's tokenizer. The new candidate is loaded in another thread
(its whole model, then released down to the decision's depth) while rounds go on with the
old one; between two rounds the worker swaps them: new streams start on the new candidate,
and the open ones end on the one they started on (``Draining``), stepped in the same rounds
by its own decoder, so no stream pauses and each is answered by one candidate. The old
candidate's memory is returned when its last stream ends; until then both are resident.

While another candidate is *evaluated*, the worker keeps the served model, fully loaded, as
judge: each stream the other candidate answers is scored by it (one teacher-forced pass,
``judged_logprob``), so HELIOS compares the candidates' perplexities on one scale. A
candidate's own perplexity of its own greedy text says little of its quality (the pruned
SmolLM2 is as sure of its text as the full model of its own). Serving another candidate
after the evaluation drops the judge, and its memory.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.runtime.llm_decoder import LlmDecoder
from services.runtime.llm_footprint import family
from services.runtime.llm_layers import LayerLoader
from services.runtime.llm_manifest import LlmManifest, load_if_intact
from services.runtime.llm_model import LoadedLlm, load


@dataclass
class Draining:
    """The candidate switched from, kept until its open streams (``ids``) end: its model,
    decoder, head thresholds, weight bytes and end-of-sequence tokens, since ``since``."""

    name: str
    llm: LoadedLlm
    decoder: LlmDecoder
    thresholds: dict[int, float]
    weight_bytes: int
    eos: frozenset[int]
    ids: set[str]
    since: float


@dataclass
class Held:
    """A candidate's model in memory, loaded to ``depth`` (its loader holds the rest on
    disk when partial); ``ms``: how long reading it took."""

    name: str
    llm: LoadedLlm
    depth: int
    loader: LayerLoader | None = None
    ms: float = 0.0


def switch_problem(models_dir: Path, name: str, depth: int, own: LlmManifest) -> str | None:
    """Why a worker holding ``own`` cannot serve candidate ``name`` at ``depth`` (None: it
    can)."""
    manifest = load_if_intact(Path(models_dir) / name)
    if manifest is None:
        return (f"candidate {name!r} is not prepared under {models_dir} "
                f"(run `offramp prepare {name}` where the workers run)")
    try:
        same = family(Path(manifest.tokenizer)) == family(Path(own.tokenizer))
    except OSError as exc:
        return f"candidate {name!r}: cannot read its tokenizer ({exc})"
    if not same:
        return f"candidate {name!r} does not share this model's tokenizer"
    return depth_problem(name, manifest.n_layers, manifest.head_layers, depth)


def depth_problem(name: str, n_layers: int, head_layers: Collection[int],
                  depth: int) -> str | None:
    """Why candidate ``name`` cannot be loaded to ``depth``: all its layers, or up to a head."""
    if depth != n_layers and depth not in head_layers:
        return f"depth {depth}: not {n_layers} and no exit head of {name} there"
    return None


def read_candidate(models_dir: Path, name: str, depth: int, threads: int = 0,
                   tokenizer: Any = None) -> Held:
    """In a worker thread: ``name``'s prepared model, with only layers ``1..depth``
    resident; ``tokenizer``: the worker's own, reused (``switch_problem`` checked that the
    candidate's tokenizer files are the same)."""
    started = time.perf_counter()
    return hold(name, load(Path(models_dir) / name, threads, tokenizer), depth, started)


def hold(name: str, llm: LoadedLlm, depth: int, started: float | None = None) -> Held:
    """``llm`` (all layers resident) kept to ``depth``: a model read now, or the judge the
    worker already holds."""
    started = time.perf_counter() if started is None else started
    loader = None
    if depth < llm.manifest.n_layers:
        loader = LayerLoader(llm.model, Path(llm.manifest.base["fp32"]))
        loader.load_to(depth)
    return Held(name, llm, depth, loader, (time.perf_counter() - started) * 1e3)


def judged_logprob(llm: LoadedLlm, prompt: list[int], tokens: list[int]) -> float:
    """In the decoding thread: ``llm``'s natural-log probability of ``tokens`` after
    ``prompt``, summed (one teacher-forced pass)."""
    import torch

    if not tokens:
        return 0.0
    ids = torch.tensor([prompt + tokens])
    with torch.inference_mode():
        logits = llm.model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1:-1]
        logp = torch.log_softmax(logits.float(), -1)
        return float(logp.gather(1, torch.tensor(tokens)[:, None]).sum())
