"""The early-exit LLM decoder (services.runtime.llm_decoder) on a tiny random Llama: its own
layer loop is HF's model, exits defer KV without changing it, and feedback is the full
model's answer."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from services.runtime.llm_decoder import LlmDecoder, Sequence, StepResult
from services.runtime.llm_heads import ExitHeads

LAYERS = 6
HEAD_LAYERS = [2, 4]
PROMPTS = [[5, 17, 99], [3, 8, 60, 61, 2, 90, 33], [7, 1, 1, 44, 120, 9, 71, 12, 30, 5, 6, 64]]


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=LAYERS, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def heads() -> ExitHeads:
    torch.manual_seed(1)
    made = ExitHeads(64, HEAD_LAYERS, rank=8)
    for layer in HEAD_LAYERS:  # not the final head read early: a real correction
        nn.init.normal_(made[layer].up.weight, std=0.3)
    return made.eval()


def fresh(prompts: list[list[int]] = PROMPTS) -> list[Sequence]:
    return [Sequence(f"r{i}", list(p)) for i, p in enumerate(prompts)]


@torch.no_grad()
def hf_logits(model: LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0]


@torch.no_grad()
def hf_kv(model: LlamaForCausalLM, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values) as positions x kv_heads x head_dim, from HF's own cache."""
    cache = model(torch.tensor([tokens]), use_cache=True).past_key_values
    return [(layer.keys[0].transpose(0, 1), layer.values[0].transpose(0, 1))
            for layer in cache.layers]


def assert_kv_exact(model: LlamaForCausalLM, seq: Sequence, layers: int = LAYERS) -> None:
    entered = seq.tokens[:-1]  # the newest token has not entered the model yet
    for layer, (keys, values) in enumerate(hf_kv(model, entered)[:layers], start=1):
        got_k, got_v = seq.kv(layer)
        assert got_k.shape == keys.shape, (seq.request_id, layer)
        assert torch.allclose(got_k, keys, atol=1e-4), (seq.request_id, layer)
        assert torch.allclose(got_v, values, atol=1e-4), (seq.request_id, layer)


@torch.no_grad()
def head_answer(model: LlamaForCausalLM, heads: ExitHeads, prefix: list[int],
                layer: int) -> tuple[int, float]:
    """What head ``layer`` says after ``prefix``, from HF's hidden state at that layer."""
    hidden = model(torch.tensor([prefix]), output_hidden_states=True).hidden_states[layer]
    logits = heads[layer](hidden[0, -1], model.model.norm, model.lm_head.weight)
    return int(logits.argmax()), float(logits.softmax(-1).max())


def test_plain_loop_is_the_hf_model(model):
    prompt = PROMPTS[2]
    decoder = LlmDecoder(model, None, keep_logits=True)
    prefixes = fresh([prompt[:n] for n in range(1, len(prompt) + 1)])  # ragged, one batch
    results = decoder.prefill(prefixes)
    reference = hf_logits(model, prompt)
    for n, result in enumerate(results):
        assert torch.allclose(result.logits, reference[n], atol=1e-4)
        assert result.token == int(reference[n].argmax()) and result.exit_layer == LAYERS
    assert_kv_exact(model, prefixes[-1])


@pytest.mark.parametrize("with_heads", [False, True])
def test_forced_to_the_last_layer_is_hf_greedy(model, heads, with_heads):
    decoder = LlmDecoder(model, heads if with_heads else None, keep_logits=True)
    thresholds = {k: math.inf for k in HEAD_LAYERS} if with_heads else {}
    seqs = fresh()
    steps = [decoder.prefill(seqs)] + [decoder.step(seqs, thresholds) for _ in range(5)]
    for i, prompt in enumerate(PROMPTS):
        tokens = list(prompt)
        for results in steps:
            reference = hf_logits(model, tokens)[-1]  # full recompute, no cache
            got = results[i]
            assert got.exit_layer == LAYERS and got.feedback == []
            assert got.token == int(reference.argmax())
            assert torch.allclose(got.logits, reference, atol=1e-4)
            tokens.append(got.token)
        assert seqs[i].tokens == tokens


def mixed_threshold(decoder: LlmDecoder, seqs: list[Sequence], layer: int) -> float:
    """A threshold at ``layer`` that some of ``seqs``' next tokens clear and some do not:
    found by a probe step on copies (the real step computes the same confidences)."""
    probe = copy.deepcopy(seqs)
    confidences = sorted(r.confidence for r in decoder.step(probe, {layer: 0.0}))
    assert confidences[0] < confidences[-1]
    return (confidences[0] + confidences[-1]) / 2


def run_with_exits(decoder: LlmDecoder, seqs: list[Sequence]) -> list[list[StepResult]]:
    """Steps whose exits land at different layers, for different sequences."""
    a, b, c = seqs
    calls: list[list[StepResult]] = [decoder.prefill(seqs)]
    calls.append(decoder.step(seqs, {2: 0.0}))
    calls.append(decoder.step([a], {4: 0.0}))  # ragged: a is ahead of b and c
    calls.append(decoder.step([b, c], {2: 0.0}))
    calls.append(decoder.step(seqs, {2: mixed_threshold(decoder, seqs, 2), 4: 0.0}))
    calls.append(decoder.step(seqs, {4: mixed_threshold(decoder, seqs, 4)}))
    calls.append(decoder.step([c, a], {2: 0.0}))
    calls.append(decoder.step(seqs, {4: 0.0}))
    calls.append(decoder.step(seqs, {}))  # every sequence runs to the last layer
    return calls


def test_exits_defer_kv_exactly_and_feedback_is_the_full_model(model, heads):
    decoder = LlmDecoder(model, heads, debug=True)
    seqs = fresh()
    calls = run_with_exits(decoder, seqs)
    layers_per_call = [{r.exit_layer for r in results} for results in calls]
    assert set().union(*layers_per_call) == {2, 4, LAYERS}
    assert any(len(found) > 1 for found in layers_per_call[4:6])  # mixed within one step
    # (a) every read key existed; after the full-depth step every layer holds every position
    assert decoder.debug.checks > 0 and decoder.debug.violations == []
    for seq in seqs:
        assert all(seq.kv_length(j) == len(seq.tokens) - 1 for j in range(1, LAYERS + 1))
        assert set(seq.depths) == {LAYERS} and seq.early == {}
        assert_kv_exact(model, seq)  # (b) deferred KV is exact
    # (c) each early token's feedback is HF's argmax after the same prefix, exactly once
    by_id = {seq.request_id: seq for seq in seqs}
    next_token = {seq.request_id: len(prompt) for seq, prompt in zip(seqs, PROMPTS, strict=True)}
    early, reported = set(), set()
    for results in calls:
        for r in results:
            seq = by_id[r.request_id]
            if r.exit_layer < LAYERS:
                early.add((r.request_id, next_token[r.request_id]))
            next_token[r.request_id] += 1
            for note in r.feedback:
                prefix = seq.tokens[:note.position]
                assert note.full_token == int(hf_logits(model, prefix)[-1].argmax())
                assert note.emitted_token == seq.tokens[note.position]
                assert (r.request_id, note.position) not in reported
                reported.add((r.request_id, note.position))
    assert reported == early


def test_an_exited_token_is_its_heads_answer_on_exact_hidden_states(model, heads):
    decoder = LlmDecoder(model, heads)
    seqs = fresh()
    decoder.prefill(seqs)
    for thresholds in ({2: 0.0}, {4: 0.0}, {2: 0.0}, {}):
        for seq, r in zip(seqs, decoder.step(seqs, thresholds), strict=True):
            if r.exit_layer < LAYERS:
                token, confidence = head_answer(model, heads, seq.tokens[:-1], r.exit_layer)
                assert r.token == token and abs(r.confidence - confidence) < 1e-5


class Untouchable(nn.Module):
    def forward(self, *args, **kwargs):
        raise AssertionError("a layer above the loaded depth ran")


def test_partial_depth_touches_no_deeper_layer(model, heads):
    truncated = copy.deepcopy(model)
    for i in range(4, LAYERS):
        truncated.model.layers[i] = Untouchable()
    decoder = LlmDecoder(truncated, heads, depth=4)
    seqs = fresh()
    results = decoder.prefill(seqs) + decoder.step(seqs, {2: 0.0})
    results += decoder.step(seqs, {}) + decoder.step(seqs, {2: 1.0})
    assert {r.exit_layer for r in results} == {2, 4}
    assert all(r.feedback == [] for r in results)
    for seq in seqs:
        assert seq.kv_length(5) == 0 and seq.kv_length(6) == 0
        assert seq.tokens[-1] == head_answer(model, heads, seq.tokens[:-1], 4)[0]
    for depth, with_heads in ((3, heads), (4, None), (0, heads), (LAYERS + 1, heads)):
        with pytest.raises(ValueError):
            LlmDecoder(model, with_heads, depth=depth)


def test_loading_more_layers_catches_up_exactly(model, heads):
    decoder = LlmDecoder(model, heads, depth=4, debug=True)
    seqs = fresh()
    decoder.prefill(seqs)
    decoder.step(seqs, {2: 0.0})
    decoder.step(seqs, {})
    small = decoder.weight_bytes()
    decoder.set_depth(LAYERS)
    assert decoder.weight_bytes() > small
    results = decoder.step(seqs, {})  # catch-up of every position through layers 5..6
    assert decoder.debug.violations == []
    for seq, r in zip(seqs, results, strict=True):
        assert r.exit_layer == LAYERS
        assert_kv_exact(model, seq)
        # the first token (at depth 4) and the two exited ones all get feedback now
        assert [n.exit_layer for n in r.feedback] == [4, 2, 4]
        for note in r.feedback:
            assert note.full_token == int(hf_logits(model, seq.tokens[:note.position])[-1]
                                          .argmax())


def test_loading_fewer_layers_trims_nothing(model, heads):
    decoder = LlmDecoder(model, heads, debug=True)
    seqs = fresh()
    decoder.prefill(seqs)
    decoder.set_depth(2)
    decoder.step(seqs, {})
    assert all(seq.kv_length(LAYERS) == len(seq.tokens) - 2 for seq in seqs)  # kept
    decoder.set_depth(LAYERS)
    decoder.step(seqs, {})
    assert decoder.debug.violations == []
    for seq in seqs:
        assert_kv_exact(model, seq)


def test_debug_mode_reports_a_read_of_missing_kv(model):
    decoder = LlmDecoder(model, None, debug=True)
    seqs = fresh()
    decoder.prefill(seqs)
    seqs[0].depths[0] = 1  # claims position 0 lacks layers 2.. while later positions have them
    decoder.step(seqs, {})
    assert any("lacking" in v for v in decoder.debug.violations)


def test_kv_bytes_grow_with_tokens_and_loaded_layers(model, heads):
    full, shallow = LlmDecoder(model, heads), LlmDecoder(model, heads, depth=4)
    deep_seq, shallow_seq = fresh()[:1], fresh()[:1]
    full.prefill(deep_seq)
    shallow.prefill(shallow_seq)
    sizes = [full.kv_bytes(deep_seq[0])]
    for _ in range(3):
        full.step(deep_seq, {})
        shallow.step(shallow_seq, {})
        sizes.append(full.kv_bytes(deep_seq[0]))
        assert full.kv_bytes(deep_seq[0]) > shallow.kv_bytes(shallow_seq[0])
    assert sizes == sorted(set(sizes))
    per_position = LAYERS * 2 * 2 * 16 * 4  # layers x (K, V) x kv heads x head dim x fp32
    assert sizes[-1] == (len(deep_seq[0].tokens) - 1) * per_position


def test_weight_bytes_count_the_loaded_parts(model, heads):
    def nbytes(module: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    shallow = LlmDecoder(model, heads, depth=2)
    expected = (nbytes(model.model.embed_tokens) + nbytes(model.model.norm)
                + nbytes(model.model.layers[0]) + nbytes(model.model.layers[1])
                + nbytes(heads[2]))
    assert shallow.weight_bytes() == expected


def test_misuse_is_refused(model):
    decoder = LlmDecoder(model, None)
    seqs = fresh()
    with pytest.raises(ValueError):
        decoder.step(seqs, {})  # not prefilled
    decoder.prefill(seqs)
    with pytest.raises(ValueError):
        decoder.prefill(seqs[:1])
    with pytest.raises(ValueError):
        decoder.step([seqs[0], seqs[0]], {})


def test_released_layers_free_their_memory_and_come_back_from_disk_exactly(model, heads,
                                                                         tmp_path):
    """Greedy partial loading for real: layers 5..6 hold no weights while decoding at depth
    4, are read back from the saved safetensors, and the catch-up is exact."""
    import copy

    from services.runtime.llm_layers import LayerLoader

    model.save_pretrained(tmp_path)
    mine = copy.deepcopy(model)
    loader = LayerLoader(mine, tmp_path)
    full = loader.resident_bytes()
    shallow = loader.load_to(4)
    assert shallow.freed_bytes == full * 2 // LAYERS and shallow.loaded_bytes == 0
    assert loader.resident_bytes() == full - shallow.freed_bytes
    assert [loader.resident(k) for k in range(1, LAYERS + 1)] == [True] * 4 + [False] * 2
    decoder = LlmDecoder(mine, heads, depth=4, debug=True)
    seqs = fresh()
    decoder.prefill(seqs)
    decoder.step(seqs, {2: 0.0})
    deep = loader.load_to(LAYERS)
    assert deep.loaded_bytes == shallow.freed_bytes and deep.freed_bytes == 0 and deep.ms >= 0
    decoder.set_depth(LAYERS)
    decoder.step(seqs, {})
    assert decoder.debug.violations == []
    for seq in seqs:
        assert_kv_exact(model, seq)  # the original model's KV: the weights came back intact
    with pytest.raises(ValueError):
        loader.load_to(0)
    with pytest.raises(FileNotFoundError):
        LayerLoader(mine, tmp_path / "nowhere")
