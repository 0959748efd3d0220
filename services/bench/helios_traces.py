"""Per-token exit traces of one generative candidate, for the HELIOS replay
(``services.sim.helios_sim``, types in ``services.sim.helios_trace``); recorded live with torch, one candidate at a time.

Per prompt (cut to ``prompt_tokens`` tokens): greedy generation at full depth with Hugging
Face ``generate`` (no sampling, exactly ``new_tokens`` tokens: ``min_new_tokens`` keeps
end-of-sequence from stopping it), then one teacher-forced forward over prompt + generation
with every hidden state. For each generated token: the full model's token and its log-prob,
and per exit head (``heads[k](hidden_states[k], model.model.norm, model.lm_head.weight)``)
its top probability (confidence), its argmax token and the *judge's* log-prob of that
token. The judge is the candidate itself by default (its own perplexity, as HELIOS measures
it), or another prepared model with the same tokenizer run teacher-forced on the same
tokens, so that candidates' perplexities compare.

Also a small timing profile of the candidate on this machine (median of ``repeats`` after
one warm-up, ms): one full-depth decode step with KV cache (context ``prompt_tokens +
new_tokens``) and the LM head alone at each batch size, and one full-depth prompt pass at
batch 1; the replay *models* step time from it (fixed + layers x per-layer(batch)). And the
memory sizes: one decoder layer's weights, the rest (embedding, final norm, an untied LM
head, the exit heads), KV bytes per token and layer.

File format: gzip JSON, ``<traces dir>/<candidate>.json.gz``::

    {"format": "offramp-helios-trace", "version": 1,
     "candidate": "smollm2-135m", "family": "tok-<12 hex>",   # digest of the vocabulary
     "judge": "smollm2-135m", "n_layers": 30, "head_layers": [6, 12, 18, 24],
     "new_tokens": 64, "prompt_tokens": 32,
     "memory": {"layer_bytes": int, "fixed_bytes": int, "kv_bytes_per_token_layer": int,
                "dtype_bytes": 4, "layer_load_ms": float or null},   # one layer from disk
     "timing": {"batches": [1, 4, 16, 64], "step_ms": [...], "lm_head_ms": [...],
                "prefill_ms": float, "context_tokens": int, "repeats": int, "threads": int},
     "prompts": [{"id": "<sha256 of the text, 16 hex>", "kind": "prose", "prompt_tokens": 32,
                  "full": {"token": [...], "logprob": [...], "judge_logprob": [...]},
                  "heads": {"6": {"confidence": [...], "token": [...],
                                  "judge_logprob": [...]}, ...}}, ...],
     "meta": {"seconds": float, "torch": "2.x", "transformers": "5.x"}}

Every per-token list has ``new_tokens`` entries; log-probs are natural logs. ``version``
changes when a field changes meaning.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import json
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from services.sim.helios_trace import CandidateTrace, HeadTrace, PromptTrace, Timing

FORMAT = "offramp-helios-trace"
VERSION = 1
BATCHES = (1, 4, 16, 64)  # up to where a 2-core CPU is compute-bound
REPEATS = 5


def prompt_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_family(tokenizer) -> str:
    """Digest of the vocabulary: candidates of one family share token ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    return "tok-" + hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:12]


def _r(xs) -> list[float]:
    return [round(float(x), 6) for x in xs]


def record_prompt(llm, ids: list[int], new_tokens: int, judge=None) -> dict[str, Any]:
    """One prompt's generation and per-token head readings (``judge``: a loaded model with
    the same tokenizer, else the candidate judges itself)."""
    import torch

    model, p = llm.model, len(ids)
    x = torch.tensor([ids])
    eos = sorted(llm.eos)
    seq = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=eos[0] if eos else None)[:, :p + new_tokens]
    gen = seq[0, p:]
    if gen.numel() != new_tokens:
        raise RuntimeError(f"generation stopped after {gen.numel()} of {new_tokens} tokens")
    res = model(seq, output_hidden_states=True, use_cache=False)
    at = slice(p - 1, p - 1 + new_tokens)  # the positions that predict the generated tokens
    own = torch.log_softmax(res.logits[0, at].float(), -1)
    judged = own if judge is None else \
        torch.log_softmax(judge(seq, use_cache=False).logits[0, at].float(), -1)
    heads = {}
    for k in llm.heads.layers:
        logits = llm.heads[k](res.hidden_states[k][0, at], model.model.norm, model.lm_head.weight)
        conf, tok = torch.softmax(logits.float(), -1).max(-1)
        heads[str(k)] = {"confidence": _r(conf), "token": tok.tolist(),
                         "judge_logprob": _r(judged.gather(1, tok[:, None])[:, 0])}
    return {"prompt_tokens": p, "heads": heads,
            "full": {"token": gen.tolist(), "logprob": _r(own.gather(1, gen[:, None])[:, 0]),
                     "judge_logprob": _r(judged.gather(1, gen[:, None])[:, 0])}}


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def timing_profile(model, prompt_tokens: int, context: int, batches: Sequence[int] = BATCHES,
                   repeats: int = REPEATS) -> dict[str, Any]:
    """Median ms of a full-depth decode step with KV cache and of the LM head alone per batch
    size, and of a full-depth prompt pass at batch 1 (random token ids, seeded)."""
    import torch

    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    # transformers 5 renamed the KV cache argument and output ``past_key_values`` -> ``cache``
    key = "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"
    g = torch.Generator().manual_seed(0)
    step, head = [], []
    with torch.inference_mode():
        for b in batches:
            kv = {key: model(torch.randint(vocab, (b, context), generator=g),
                             use_cache=True)[key]}
            nxt = torch.randint(vocab, (b, 1), generator=g)
            # each call appends one position to the cache: repeats + 1 of ``context`` is noise
            step.append(_median_ms(partial(model, nxt, use_cache=True, **kv), repeats))
            head.append(_median_ms(partial(model.lm_head, torch.randn(b, 1, hidden, generator=g)),
                                   repeats))
        prompt = torch.randint(vocab, (1, prompt_tokens), generator=g)
        prefill = _median_ms(partial(model, prompt, use_cache=False), repeats)
    return {"batches": list(batches), "step_ms": _r(step), "lm_head_ms": _r(head),
            "prefill_ms": round(prefill, 6), "context_tokens": context, "repeats": repeats,
            "threads": torch.get_num_threads()}


def layer_load_ms(llm, layers: int = 3, repeats: int = 3) -> float | None:
    """Median ms to read one decoder layer back from the saved base weights (greedy
    partial loading, ``runtime.llm_layers``): the last ``layers`` are released and restored
    in place, so the model ends as it was. None without safetensors weights."""
    from services.runtime.llm_layers import LayerLoader

    try:
        loader = LayerLoader(llm.model, Path(llm.manifest.base["fp32"]))
    except (FileNotFoundError, KeyError, AttributeError):
        return None
    n = loader.n_layers
    layers = min(layers, n - 1)
    if layers < 1:
        return None
    times = []
    for _ in range(repeats):
        loader.load_to(n - layers)
        times.append(loader.load_to(n).ms / layers)
    return round(statistics.median(times), 3)


def memory_profile(llm) -> dict[str, int | float | None]:
    """Weight bytes of one decoder layer (they are alike), of everything else (embedding,
    final norm, an untied LM head, the exit heads), KV bytes per token and layer, and the
    measured time to read one layer back from disk."""
    model, cfg = llm.model, llm.model.config
    seen: dict[int, int] = {}
    for prm in model.parameters():  # a tied LM head shares the embedding's storage
        seen[prm.data_ptr()] = prm.numel() * prm.element_size()
    layer = sum(prm.numel() * prm.element_size() for prm in model.model.layers[0].parameters())
    heads = sum(prm.numel() * prm.element_size() for prm in llm.heads.parameters())
    dtype_bytes = next(model.parameters()).element_size()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {"layer_bytes": layer,
            "fixed_bytes": sum(seen.values()) - cfg.num_hidden_layers * layer + heads,
            "kv_bytes_per_token_layer": 2 * cfg.num_key_value_heads * head_dim * dtype_bytes,
            "dtype_bytes": dtype_bytes, "layer_load_ms": layer_load_ms(llm)}


def record(llm, prompts: Sequence[tuple[str, str]], new_tokens: int, prompt_tokens: int,
           judge=None, batches: Sequence[int] = BATCHES, repeats: int = REPEATS,
           log: Callable[[str], None] = print) -> dict[str, Any]:
    """The trace of ``llm`` (``services.runtime.llm_model.load``) over ``prompts`` ((kind,
    text) pairs), judged by ``judge`` (another loaded model of the same tokenizer family)
    or by itself."""
    import torch
    import transformers

    name = llm.manifest.name
    family = tokenizer_family(llm.tokenizer)
    if judge is not None and tokenizer_family(judge.tokenizer) != family:
        raise ValueError(f"judge {judge.manifest.name} does not share {name}'s tokenizer")
    t0 = time.perf_counter()
    rows = []
    with torch.inference_mode():
        for i, (kind, text) in enumerate(prompts):
            ids = llm.tokenizer.encode(text)[:prompt_tokens]
            if not ids:
                raise ValueError(f"prompt {i} ({kind}) has no tokens")
            row = record_prompt(llm, ids, new_tokens, None if judge is None else judge.model)
            rows.append({"id": prompt_id(text), "kind": kind, **row})
            log(f"  {name}: prompt {i + 1}/{len(prompts)} ({kind})")
    log(f"  {name}: timing decode steps at batches {list(batches)}")
    timing = timing_profile(llm.model, prompt_tokens, prompt_tokens + new_tokens, batches,
                            repeats)
    return {"format": FORMAT, "version": VERSION, "candidate": name, "family": family,
            "judge": name if judge is None else judge.manifest.name,
            "n_layers": llm.model.config.num_hidden_layers, "head_layers": list(llm.heads.layers),
            "new_tokens": new_tokens, "prompt_tokens": prompt_tokens,
            "memory": memory_profile(llm), "timing": timing, "prompts": rows,
            "meta": {"seconds": round(time.perf_counter() - t0, 3), "torch": torch.__version__,
                     "transformers": transformers.__version__}}


def save(trace: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(trace, f, separators=(",", ":"))
    tmp.replace(path)  # a crash never leaves half a trace under the real name
    return path


def read(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        d = json.load(f)
    if d.get("format") != FORMAT or d.get("version") != VERSION:
        raise ValueError(f"{path}: not a version {VERSION} HELIOS trace "
                         f"(format {d.get('format')!r}, version {d.get('version')!r})")
    return d


def _prompt(p: dict[str, Any]) -> PromptTrace:
    heads = {int(k): HeadTrace(tuple(h["confidence"]), tuple(h["token"]),
                               tuple(h["judge_logprob"])) for k, h in p["heads"].items()}
    return PromptTrace(p["id"], p["kind"], int(p["prompt_tokens"]), tuple(p["full"]["token"]),
                       tuple(p["full"]["judge_logprob"]), heads)


def from_dict(d: dict[str, Any]) -> CandidateTrace:
    """The replay's view of a trace."""
    t, m = d["timing"], d["memory"]
    n = int(d["n_layers"])
    timing = Timing(tuple(t["batches"]), tuple(t["step_ms"]), tuple(t["lm_head_ms"]),
                    float(t["prefill_ms"]), n)
    return CandidateTrace(d["candidate"], d["family"], d["judge"], n, int(m["layer_bytes"]),
                          int(m["fixed_bytes"]), int(m["kv_bytes_per_token_layer"]),
                          int(d["new_tokens"]), int(d["prompt_tokens"]), timing,
                          tuple(_prompt(p) for p in d["prompts"]), m.get("layer_load_ms"))


def load(path: Path) -> CandidateTrace:
    return from_dict(read(path))
