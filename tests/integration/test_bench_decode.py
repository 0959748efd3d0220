"""The decode bench's measurement on the tiny random Llama: exit-free decoding runs every
layer and agrees with itself; with every token leaving at the first head, tokens run two
layers (the prompt's pass: all six), each early token is judged against the full model once,
and the identical-prefix share compares the two outputs."""

from __future__ import annotations

import torch

from services.bench.decode import decode, judged, summarise
from services.runtime.llm_decoder import LlmDecoder
from services.runtime.llm_heads import ExitHeads
from services.zoo import tiny_llm


def test_exit_free_and_exit_runs_are_measured_side_by_side():
    torch.set_num_threads(1)
    net = tiny_llm.model(64)
    decoder = LlmDecoder(net, ExitHeads(64, [2, 4]))
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]
    free = decode(decoder, prompts, 6, {})
    fast = decode(decoder, prompts, 6, {2: 0.0, 4: 0.0})
    assert free.exits == {6: 12} and free.early == 0
    assert fast.exits == {6: 2, 2: 10} and fast.early == 10  # every early token judged once
    ref = [net.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False)[0, 4:].tolist()
           for p in prompts]
    assert free.tokens == ref
    s_free = summarise([free], 6, 2, 6)
    s_fast = summarise([fast], 6, 2, 6, [free])
    assert s_free["mean_layers"] == 6 and "token_agreement" not in s_free
    assert s_fast["mean_layers"] == (2 * 6 + 10 * 2) / 12
    assert s_fast["token_agreement"] == 1 - (10 - fast.agree) / 12
    first_gap = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), 6)
                 for x, y in zip(fast.tokens, free.tokens)]
    assert s_fast["identical_prefix_tokens"] == sum(first_gap) / 12


def test_a_partial_depth_run_is_judged_token_by_token_by_the_full_model():
    torch.set_num_threads(1)
    net = tiny_llm.model(64)
    heads = ExitHeads(64, [2, 4])
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]
    run = decode(LlmDecoder(net, heads, depth=4), prompts, 6, {})
    assert set(run.exits) == {4} and run.early == 12
    expected = 0
    for p, toks in zip(prompts, run.tokens, strict=True):
        for i, tok in enumerate(toks):  # the full model's next token after the same prefix
            logits = net(torch.tensor([p + toks[:i]])).logits[0, -1]
            expected += int(logits.argmax()) == tok
    assert run.agree == expected == judged(net, prompts[0], run.tokens[0]) + judged(
        net, prompts[1], run.tokens[1])
