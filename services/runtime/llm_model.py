"""What an LLM worker runs: the base model a generative model's manifest names (its fp32
copy, saved once by preparation), its tokenizer and its exit heads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.runtime.llm_heads import ExitHeads
from services.runtime.llm_manifest import LlmManifest


@dataclass
class LoadedLlm:
    manifest: LlmManifest
    model: Any        # transformers LlamaForCausalLM, eval mode, fp32
    tokenizer: Any    # transformers tokenizer
    heads: ExitHeads

    @property
    def eos(self) -> frozenset[int]:
        ids = self.model.generation_config.eos_token_id
        ids = ids if isinstance(ids, list) else [ids]
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return frozenset(int(i) for i in ids if i is not None)

    @property
    def context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


def load(model_dir: Path, threads: int = 0, tokenizer: Any = None) -> LoadedLlm:
    """The prepared model at ``model_dir`` (``offramp prepare NAME`` made it), on the CPU
    threads given (0: torch's default); ``tokenizer``: one already loaded with the same
    tokenizer files (a candidate of the same family), reused: loading it again takes
    longer than the model itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads > 0:
        torch.set_num_threads(threads)
    manifest = LlmManifest.load(model_dir)
    problems = manifest.verify(model_dir)
    if problems:
        raise SystemExit(f"{manifest.name} at {model_dir} is damaged ({'; '.join(problems)}): "
                         f"run `offramp prepare {manifest.name}` again")
    base = Path(manifest.base["fp32"])
    if not base.is_dir():
        raise SystemExit(f"the base model of {manifest.name} is missing at {base}: run "
                         f"`offramp prepare {manifest.name}` again")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(manifest.tokenizer)
    heads = ExitHeads.load(Path(model_dir) / manifest.heads_file)
    return LoadedLlm(manifest, model, tokenizer, heads)
