"""The model's own greedy continuations as distillation text for its exit heads.

Heads only ever answer while the model generates, and the text a model generates is not
the text it reads: it is its own most likely continuation, so its next tokens are easier
and its hidden states lie elsewhere than on quotes and docstrings. Heads distilled on the
corpus alone stay unsure on that text. Each window here is the opening of a corpus document
(the prompt) followed by the model's greedy continuation of it, as long as a teacher window.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

Tokenize = Callable[[list[str]], list[list[int]]]


def prompts_of(tokenize: Tokenize, docs: Sequence[str], prompt_tokens: int,
               count: int, chunk: int = 64) -> list[list[int]]:
    """The first ``prompt_tokens`` tokens of the first ``count`` documents that long."""
    out: list[list[int]] = []
    for start in range(0, len(docs), chunk):
        for ids in tokenize(list(docs[start:start + chunk])):
            if len(ids) >= prompt_tokens:
                out.append(ids[:prompt_tokens])
                if len(out) == count:
                    return out
    return out


@torch.inference_mode()
def generated_windows(model: nn.Module, prompts: list[list[int]], new_tokens: int,
                      batch: int = 16, log: Callable[[str], None] = print) -> torch.Tensor:
    """``len(prompts) x (prompt + new_tokens)`` token windows: each prompt (all of one
    length) followed by the model's greedy continuation. End-of-sequence does not stop a
    continuation, so every window is full."""
    if not prompts:
        return torch.empty(0, new_tokens, dtype=torch.int64)
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("generation prompts must share one length")
    rows, started = [], time.monotonic()
    for start in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[start:start + batch], dtype=torch.int64)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=0, top_p=None, top_k=None, temperature=None)
        rows.append(out[:, :ids.shape[1] + new_tokens])
        done = start + ids.shape[0]
        log(f"  generations: {done}/{len(prompts)} prompts, "
            f"{done * new_tokens / (time.monotonic() - started):.0f} tokens/s")
    return torch.cat(rows)
