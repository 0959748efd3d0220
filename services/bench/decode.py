"""``offramp bench decode``: Apparate's parallel decoding against exit-free decoding of the
same prompts, in process (live torch, no bus), at equal output.

Prompts are the openings of held-out documents of both text kinds (prose, code). Each
round decodes a batch of prompts twice, back to back, alternating which goes first:
exit-free (every token runs every layer) and with exits (a head answers a token when its
top probability reaches the threshold; skipped layers get their KV in the next token's
pass). Every stream produces ``max_tokens`` tokens (end-of-sequence does not stop it), so
both runs do the same amount of output. Reported per mode: tokens/s, TPOT (decode steps
only), the mean layers a token ran and the exit share per head; for the exit run, token
agreement with the full model (each early token against the full model's token for the
same prefix, from the deferred pass) and the tokens identical to the exit-free output up
to the first difference.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from services.runtime.llm_decoder import LlmDecoder, Sequence


@dataclass
class DecodeRun:
    tokens: list[list[int]]      # per prompt, the generated tokens
    exits: Counter               # layers run -> tokens
    agree: int                   # early tokens the full model agrees with
    early: int                   # early tokens with feedback
    decode_s: float              # the decode steps (after the prompt's pass)
    total_s: float               # prefill included


def decode(decoder: LlmDecoder, prompts: list[list[int]], max_tokens: int,
           thresholds: dict[int, float]) -> DecodeRun:
    seqs = [Sequence(f"p{i}", list(p)) for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    out = decoder.prefill(seqs)
    t1 = time.perf_counter()
    results = [out]
    for _ in range(max_tokens - 1):
        results.append(decoder.step(seqs, thresholds))
    t2 = time.perf_counter()
    # one more pass (not timed, its token dropped): the last early tokens' deferred layers
    # run, so every early token gets its feedback (at full depth)
    results.append(decoder.step(seqs, {}))
    exits: Counter = Counter()
    tokens: list[list[int]] = [[] for _ in prompts]
    agree = early = 0
    for step, res in enumerate(results):
        for i, r in enumerate(res):
            for f in r.feedback:
                early += 1
                agree += f.emitted_token == f.full_token
            if step < len(results) - 1:
                tokens[i].append(r.token)
                exits[r.exit_layer] += 1
    if decoder.depth < decoder.n_layers:  # no token reaches the last layer: judge them all
        early = sum(len(t) for t in tokens)
        agree = sum(judged(decoder.model, p, t) for p, t in zip(prompts, tokens, strict=True))
    return DecodeRun(tokens, exits, agree, early, t2 - t1, t2 - t0)


@torch.no_grad()
def judged(model, prompt: list[int], tokens: list[int]) -> int:
    """Tokens of ``tokens`` (generated after ``prompt``) that the full model, given the same
    prefix, would have produced: one teacher-forced pass."""
    ids = torch.tensor([prompt + tokens[:-1]])
    full = model(input_ids=ids).logits[0, len(prompt) - 1:].argmax(-1).tolist()
    return sum(a == b for a, b in zip(full, tokens, strict=True))


def _same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def summarise(runs: list[DecodeRun], n_layers: int, batch: int, max_tokens: int,
              reference: list[DecodeRun] | None = None) -> dict:
    tokens = batch * max_tokens
    exits: Counter = sum((r.exits for r in runs), Counter())
    total = sum(exits.values())
    out = {
        "tokens_per_s": statistics.median(tokens / r.total_s for r in runs),
        "tpot_ms": statistics.median(r.decode_s * 1e3 / (max_tokens - 1) for r in runs),
        "mean_layers": sum(k * v for k, v in exits.items()) / total,
        "exit_share": {str(k): v / total for k, v in sorted(exits.items())},
        "runs_tokens_per_s": [tokens / r.total_s for r in runs],
    }
    early = sum(r.early for r in runs)
    if early:
        out["early_agreement"] = sum(r.agree for r in runs) / early
        out["token_agreement"] = 1 - (early - sum(r.agree for r in runs)) / total
    if reference is not None:
        same = [_same_prefix(a, b) for r, ref in zip(runs, reference, strict=True)
                for a, b in zip(r.tokens, ref.tokens, strict=True)]
        out["identical_prefix_tokens"] = sum(same) / (len(same) * max_tokens)
    return out


def prompts_of(tokenizer, docs: list[str], n: int, length: int) -> list[list[int]]:
    out = []
    for doc in docs:
        ids = tokenizer.encode(doc)
        if len(ids) >= length:
            out.append(ids[:length])
        if len(out) == n:
            break
    return out


def run_decode(args) -> int:
    from services.common import config as config_mod
    from services.runtime.llm_model import load
    from services.zoo import llm_corpus

    cfg = config_mod.load()
    model = args.model or "smollm2-135m"
    torch.set_num_threads(max(1, cfg.ort_threads) if cfg.ort_threads else torch.get_num_threads())
    llm = load(cfg.models_dir / model)
    corpus = llm_corpus.load_corpus(0, 0.2, cfg.home / "data")
    per_kind = max(1, args.batch * args.rounds // len(corpus.kinds))
    prompts = [p for kind in corpus.kinds
               for p in prompts_of(llm.tokenizer, corpus.held[kind], per_kind, args.prompt_tokens)]
    decoder = LlmDecoder(llm.model, llm.heads)
    # with --depth the exit run loads only that many layers: its head answers the rest
    shallow = LlmDecoder(llm.model, llm.heads, args.depth) if args.depth else decoder
    heads = ([int(k) for k in args.heads.split(",")] if args.heads else llm.heads.layers)
    thresholds = {k: args.threshold for k in heads}  # heads not named are not evaluated
    free, ee = [], []
    print(f"decode bench: {model}, {len(prompts)} prompts of {args.prompt_tokens} tokens, "
          f"batch {args.batch}, {args.max_tokens} tokens each, threshold {args.threshold} at "
          f"heads {heads}, exit run loaded to {shallow.depth} of {decoder.n_layers} layers",
          flush=True)
    for i in range(0, len(prompts) - args.batch + 1, args.batch):
        batch = prompts[i:i + args.batch]
        pair = [("free", {}), ("exits", thresholds)]
        for name, th in pair if (i // args.batch) % 2 == 0 else pair[::-1]:
            run = decode(decoder if name == "free" else shallow, batch, args.max_tokens, th)
            (free if name == "free" else ee).append(run)
        print(f"  round {len(free)}: exit-free {args.batch * args.max_tokens / free[-1].total_s:.1f}"
              f" tok/s, exits {args.batch * args.max_tokens / ee[-1].total_s:.1f} tok/s", flush=True)
    n = decoder.n_layers
    result = {"bench": "decode", "mode": "live, in process", "model": model,
              "threshold": args.threshold, "batch": args.batch, "max_tokens": args.max_tokens,
              "prompt_tokens": args.prompt_tokens, "rounds": len(free),
              "threads": torch.get_num_threads(), "layers": n, "heads": heads,
              "depth": shallow.depth,
              "exit_free": summarise(free, n, args.batch, args.max_tokens),
              "exits": summarise(ee, n, args.batch, args.max_tokens, free)}
    result["speedup"] = result["exits"]["tokens_per_s"] / result["exit_free"]["tokens_per_s"]
    print_table(result)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def print_table(r: dict) -> None:
    print(f"\n{'mode':<10} {'tok/s':>7} {'TPOT ms':>8} {'layers':>7} {'agreement':>10} "
          f"{'same prefix':>12}")
    for name in ("exit_free", "exits"):
        m = r[name]
        agr = f"{100 * m['token_agreement']:.2f}%" if "token_agreement" in m else "100%"
        same = (f"{100 * m['identical_prefix_tokens']:.1f}%"
                if "identical_prefix_tokens" in m else "-")
        print(f"{name:<10} {m['tokens_per_s']:>7.1f} {m['tpot_ms']:>8.1f} "
              f"{m['mean_layers']:>7.2f} {agr:>10} {same:>12}")
    print(f"speedup (exits / exit-free, median tokens/s): {r['speedup']:.2f}x")
