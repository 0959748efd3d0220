"""The transformer supernet's operators on a tiny random BERT (built in milliseconds): a
subnet served in place equals the same subnet copied out as a standalone model; subnets
switch back to back with no state; LayerSelect follows the every-other rule; WeightSlice
keeps the most important heads and neurons after rewiring; the largest subnet is the
pretrained BERT + pooling + head it was made from."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from transformers import BertConfig, BertModel

from services.supernet.bert_subnet import (
    BertSubnet,
    BertSubnetSpace,
    kept_layers,
    parse_bert_subnet,
)
from services.supernet.bert_supernet import BertSupernet, arch_of, from_bert
from services.supernet.bert_training import length_batches, rewire
from services.supernet.conv_supernet import module_bytes

CONFIG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=4,
                    num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)
CLASSES = 5
SUBNETS = [BertSubnet(4, 1.0, 1.0), BertSubnet(1, 0.25, 0.25), BertSubnet(3, 0.5, 1.0),
           BertSubnet(2, 0.75, 0.5), BertSubnet(3, 1.0, 0.25)]


def tiny_bert(seed: int = 0) -> tuple[BertModel, torch.nn.Linear]:
    torch.manual_seed(seed)
    return BertModel(CONFIG, add_pooling_layer=False).eval(), torch.nn.Linear(32, CLASSES)


def tiny_supernet(seed: int = 0) -> BertSupernet:
    bert, head = tiny_bert(seed)
    net = from_bert(bert.embeddings, bert.encoder.layer, head, arch_of(CONFIG, CLASSES))
    with torch.no_grad():   # heads that differ per depth, as the fitted ones do
        for k, h in enumerate(net.heads):
            h.weight.add_(0.1 * k)
    return net.eval()


def tokens(n: int, seq: int = 12, seed: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded rows of random lengths (the first always full)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, CONFIG.vocab_size, (n, seq), generator=g)
    lengths = torch.randint(2, seq + 1, (n,), generator=g)
    lengths[0] = seq
    mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


@pytest.mark.parametrize("subnet", SUBNETS, ids=lambda s: s.key)
def test_in_place_subnet_equals_extracted_model(subnet):
    net, x = tiny_supernet(), tokens(5)
    with torch.no_grad():
        served = net(x, subnet)
        alone = net.extract(subnet)(**x)
    assert served.shape == (5, CLASSES)
    torch.testing.assert_close(served, alone, atol=1e-5, rtol=1e-5)
    assert module_bytes(net.extract(subnet)) < module_bytes(net)


def test_largest_subnet_is_the_pretrained_bert_with_its_head():
    bert, head = tiny_bert()
    net = from_bert(bert.embeddings, bert.encoder.layer, head, arch_of(CONFIG, CLASSES))
    x = tokens(4)
    with torch.no_grad():
        h = bert(**x).last_hidden_state
        m = x["attention_mask"].unsqueeze(-1).float()
        ref = head(F.normalize((h * m).sum(1) / m.sum(1), dim=-1))
        torch.testing.assert_close(net(x, net.space.largest), ref, atol=1e-5, rtol=1e-5)


def test_subnets_switch_back_to_back_without_state():
    net, x = tiny_supernet(), tokens(4)
    with torch.no_grad():
        first = [net(x, s) for s in SUBNETS]
        again = [net(x, s) for s in reversed(SUBNETS)][::-1]
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    assert not torch.allclose(first[0], first[1])   # the subnets really differ


def test_padding_and_trimming_change_nothing():
    net, x = tiny_supernet(), tokens(6)
    s = SUBNETS[2]
    with torch.no_grad():
        full = net(x, s)
        alone = torch.cat([net({k: v[i:i + 1, :int(x["attention_mask"][i].sum())]
                                for k, v in x.items()}, s) for i in range(6)])
    torch.testing.assert_close(full, alone, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(net.predict(x, s, chunk=2), full.argmax(1).numpy())


def test_layer_select_follows_the_every_other_rule():
    for layers in (4, 6, 12):
        for depth in range(1, layers):
            kept = kept_layers(layers, depth)
            assert len(kept) == depth and kept[0] == 0 and list(kept) == sorted(set(kept))
            if layers % (layers - depth) == 0:   # §3.1: drop 1-based n with n mod p == 0
                p = layers // (layers - depth)
                assert kept == tuple(n - 1 for n in range(1, layers + 1) if n % p)
        assert kept_layers(layers, layers) == tuple(range(layers))
    assert kept_layers(6, 3) == (0, 2, 4) and kept_layers(6, 2) == (0, 3)
    with pytest.raises(ValueError, match="outside"):
        kept_layers(6, 7)


def test_skipped_layers_and_sliced_heads_get_no_gradient():
    net = tiny_supernet().train()
    net.requires_grad_(True)
    net(tokens(3), BertSubnet(2, 0.5, 0.25)).sum().backward()   # layers 0 and 2
    a = net.encoder.blocks[0].attention
    assert a.query.weight.grad[:16].abs().sum() > 0          # heads 0-1 of 4 (8 dims each)
    assert a.query.weight.grad[16:].abs().sum() == 0
    assert net.encoder.blocks[0].ffn.inner.weight.grad[16:].abs().sum() == 0
    assert net.encoder.blocks[1].attention.query.weight.grad is None
    assert net.heads[1].weight.grad is not None and net.heads[3].weight.grad is None


def test_rewiring_keeps_the_full_model_and_sorts_importance():
    net, x = tiny_supernet(), tokens(16)
    labels = np.arange(16) % CLASSES
    data = {k: v.numpy() for k, v in x.items()}
    with torch.no_grad():
        before = net(x, net.space.largest)
    rewire(net, list(length_batches(data, 8, np.random.default_rng(0), labels)))
    with torch.no_grad():
        torch.testing.assert_close(net(x, net.space.largest), before, atol=1e-5, rtol=1e-5)
    # measured again on the same batches, importance is now in descending order
    net.requires_grad_(True)
    net.zero_grad()
    for xb, yb in length_batches(data, 8, np.random.default_rng(0), labels):
        F.cross_entropy(net(xb, net.space.largest), yb, reduction="sum").backward()
    imp = net.encoder.blocks[1].ffn.importance().abs()
    assert imp[0] >= imp[-1]


def test_keys_round_trip_and_the_space_checks_them():
    space = BertSubnetSpace(4, (0.5, 1.0), (0.25, 1.0))
    every = list(space.all())
    assert len(every) == space.size() == 4 * 2 * 2 == len({s.key for s in every})
    for s in every:
        assert parse_bert_subnet(s.key) == s and space.check(s) == s
    assert BertSubnet(3, 0.5, 0.75).key == "L=3;H=0.5;F=0.75"
    assert space.largest == BertSubnet(4, 1.0, 1.0)
    assert space.smallest == BertSubnet(1, 0.5, 0.25)
    rng = np.random.default_rng(0)
    for _ in range(20):
        child = space.mutate(space.sample(rng), rng)
        space.check(child)
    for bad, why in ((BertSubnet(5, 1.0, 1.0), "depth 5"), (BertSubnet(2, 0.3, 1.0), "0.3")):
        with pytest.raises(ValueError, match=why):
            space.check(bad)
    for bad, why in (("D=1;W=1", "L=depth"), ("L=x;H=1;F=1", "integer")):
        with pytest.raises(ValueError, match=why):
            parse_bert_subnet(bad)
