"""The pruned derivative (a second HELIOS candidate) on the tiny random Llama: block
influence ranks the layers, the least influential ones go (never the first or last), the
rest are renumbered and saved as a plain model that reloads exactly, partial loading reads
its layers back, and the copy is made once."""

from __future__ import annotations

import json

import pytest
import torch

from services.prepare import llm_pruned
from services.runtime.llm_layers import LayerLoader
from services.zoo import tiny_llm


@pytest.fixture()
def tiny():
    torch.manual_seed(0)
    tok = tiny_llm.tokenizer()
    return tiny_llm.model(len(tok)).eval(), tok


def _windows(tok) -> list[torch.Tensor]:
    ids = tok.encode("Once upon a time there was a sea, and the sea was calm. " * 3)
    return [torch.tensor([ids[:24], ids[5:29]])]


def test_block_influence_ranks_every_layer_but_never_drops_the_last(tiny):
    model, tok = tiny
    influence = llm_pruned.block_influence(model, _windows(tok))
    assert len(influence) == 6 and influence[-1] == float("inf")
    assert all(0 <= x < 2 for x in influence[:-1])
    assert llm_pruned.least_influential([5, 1, 3, 0.5, 2, 9], 2) == [1, 3]  # not layer 0
    with pytest.raises(ValueError, match="cannot drop"):
        llm_pruned.least_influential(influence, 4)


def test_the_pruned_model_keeps_the_other_layers_renumbered_and_reloads_exactly(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    model, tok = tiny
    q = [layer.self_attn.q_proj.weight.clone() for layer in model.model.layers]
    calls: list[int] = []

    def load():
        calls.append(1)
        return model, tok

    folder = llm_pruned.ensure_pruned(tmp_path / "pruned", load, lambda: _windows(tok), 2,
                                      log=lambda _m: None)
    again = llm_pruned.ensure_pruned(folder, load, lambda: _windows(tok), 2, log=lambda _m: None)
    assert again == folder and calls == [1]  # made once
    reloaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert reloaded.config.num_hidden_layers == 4 and len(reloaded.model.layers) == 4
    assert [layer.self_attn.layer_idx for layer in reloaded.model.layers] == [0, 1, 2, 3]
    dropped = json.loads((folder / "pruned.json").read_text())["dropped"]  # 1-based
    kept = [q[i] for i in range(6) if i + 1 not in dropped]
    assert len(dropped) == 2 and 1 not in dropped and 6 not in dropped
    assert all(torch.equal(layer.self_attn.q_proj.weight, w)
               for layer, w in zip(reloaded.model.layers, kept, strict=True))
    ids = torch.tensor([tok.encode("The sea was calm")])
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)  # model: pruned in place
    loader = LayerLoader(reloaded, folder)  # partial loading reads its renumbered layers
    loader.load_to(2)
    assert not loader.resident(3)
    loader.load_to(4)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
