"""SubNetAct's operators: a subnet served in place equals the same subnet copied out as a
standalone model; normalization statistics are kept and used per subnet; one copy of
the weights serves every subnet."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.supernet.conv_supernet import ConvArch, ConvSupernet, module_bytes
from services.supernet.operators import SubnetNorm, calibrate, stats_bytes
from services.supernet.subnet import Subnet, SubnetSpace, parse_subnet

ARCH = ConvArch(channels=(8, 16, 24), max_depths=(2, 3, 2), stem=8, classes=5)
SUBNETS = [
    Subnet((2, 3, 2), (1.0, 1.0, 1.0)),
    Subnet((1, 1, 1), (0.25, 0.25, 0.25)),
    Subnet((2, 1, 2), (0.5, 1.0, 0.75)),
    Subnet((1, 3, 1), (0.75, 0.25, 1.0)),
]


def trained_supernet(seed: int = 0) -> ConvSupernet:
    """A supernet with non-trivial weights and affine norms, calibrated for SUBNETS."""
    torch.manual_seed(seed)
    net = ConvSupernet(ARCH)
    with torch.no_grad():
        for norm in net.modules():
            if isinstance(norm, SubnetNorm):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.2, 0.2)
    batches = [torch.randn(6, 3, 16, 16) for _ in range(3)]
    for s in SUBNETS:
        calibrate(net, s.key, lambda x, s=s: net(x, s), batches)
    return net.eval()


@pytest.mark.parametrize("subnet", SUBNETS, ids=lambda s: s.key)
def test_in_place_subnet_equals_extracted_model(subnet):
    net = trained_supernet()
    x = torch.randn(5, 3, 16, 16)
    with torch.no_grad():
        served = net(x, subnet)
        alone = net.extract(subnet)(x)
    assert served.shape == (5, ARCH.classes)
    torch.testing.assert_close(served, alone, atol=1e-5, rtol=1e-5)


def test_subnets_switch_back_to_back_without_state():
    net = trained_supernet()
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        first = [net(x, s) for s in SUBNETS]
        again = [net(x, s) for s in reversed(SUBNETS)][::-1]
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    assert not torch.allclose(first[0], first[1])   # the subnets really differ


def test_each_subnet_normalizes_with_its_own_statistics():
    net = trained_supernet()
    big, small = SUBNETS[0], SUBNETS[1]
    norm = net.stem_norm
    assert set(norm.stats) == {s.key for s in SUBNETS}
    skipped = net.stages[1].blocks[2].norm1   # only subnets of stage-1 depth 3 run it
    assert set(skipped.stats) == {s.key for s in SUBNETS if s.depths[1] == 3}
    # the stem sees raw pixels in every subnet; deeper norms see different activations
    deep = net.stages[0].blocks[0].norm2
    assert not torch.allclose(deep.stats[big.key][0], deep.stats[small.key][0])
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        before = net(x, big)
        for n in net.modules():   # corrupt the small subnet's statistics only
            if isinstance(n, SubnetNorm) and small.key in n.stats:
                mean, var = n.stats[small.key]
                n.stats[small.key] = (mean + 5.0, var * 9.0)
        assert torch.equal(net(x, big), before)
        wrong = net(x, small)
    net_ok = trained_supernet()
    with torch.no_grad():
        assert not torch.allclose(wrong, net_ok(x, small))


def test_calibration_statistics_are_the_exact_activation_moments():
    torch.manual_seed(3)
    net = ConvSupernet(ARCH)
    s = SUBNETS[2]
    batches = [torch.randn(4, 3, 8, 8) for _ in range(2)]
    calibrate(net, s.key, lambda x: net(x, s), batches)
    with torch.no_grad():
        stem = torch.cat([net.stem(b, ARCH.stem) for b in batches])
    mean, var = net.stem_norm.stats[s.key]
    torch.testing.assert_close(mean, stem.mean((0, 2, 3)), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(var, stem.var((0, 2, 3), unbiased=False), atol=1e-5, rtol=1e-4)


def test_uncalibrated_subnet_is_refused():
    net = trained_supernet()
    other = Subnet((2, 2, 2), (1.0, 1.0, 1.0))
    with pytest.raises(KeyError, match="calibrate"):
        net(torch.randn(1, 3, 16, 16), other)
    with pytest.raises(KeyError, match="calibrate"):
        net.extract(other)


def test_subnet_outside_the_space_is_refused():
    net = trained_supernet()
    x = torch.randn(1, 3, 16, 16)
    for bad, what in ((Subnet((3, 1, 1), (1.0,) * 3), "depth 3"),
                      (Subnet((1, 1, 1), (0.3, 1.0, 1.0)), "width 0.3"),
                      (Subnet((1, 1), (1.0, 1.0)), "3 stages")):
        with pytest.raises(ValueError, match=what):
            net(x, bad)


def test_training_mode_uses_batch_statistics_for_any_subnet():
    net = ConvSupernet(ARCH).train()
    out = net(torch.randn(4, 3, 16, 16), Subnet((1, 2, 1), (0.5, 0.5, 0.5)))
    out.sum().backward()   # gradients reach the shared weights through the slices
    assert net.stem.weight.grad is not None
    block = net.stages[1].blocks[1]
    assert block.conv1.weight.grad[:8].abs().sum() > 0
    assert block.conv1.weight.grad[8:].abs().sum() == 0   # sliced-off filters untouched
    assert not net.stages[1].blocks[2].conv1.weight.grad  # the skipped block


def test_one_copy_of_weights_is_smaller_than_separate_subnets():
    net = trained_supernet()
    keys = [s.key for s in SUBNETS]
    shared = module_bytes(net) + stats_bytes(net, keys)
    separate = sum(module_bytes(net.extract(s)) for s in SUBNETS)
    assert shared < separate
    assert stats_bytes(net, keys) < module_bytes(net) / 10


def test_subnet_keys_round_trip_and_space_enumerates_everything():
    space = SubnetSpace((2, 3), (0.5, 1.0))
    every = list(space.all())
    assert len(every) == space.size() == 2 * 3 * 2 * 2
    assert len({s.key for s in every}) == len(every)
    for s in every:
        assert parse_subnet(s.key) == s
    assert space.largest == Subnet((2, 3), (1.0, 1.0))
    assert space.smallest == Subnet((1, 1), (0.5, 0.5))
    rng = np.random.default_rng(1)
    sandwich = space.sandwich(rng)
    assert sandwich[:2] == [space.largest, space.smallest] and len(sandwich) == 4
    for s in sandwich:
        space.check(s)
    with pytest.raises(ValueError, match="D=d1"):
        parse_subnet("depth=1")
    with pytest.raises(ValueError, match="integers"):
        parse_subnet("D=a;W=1")
