"""The exit wrapper (services/optimizer/exit_wrapper.py, E3 §3.4): inside a stage, ramps
that cost more than their exits save are switched off; the stage's cut always runs."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from services.optimizer.block_costs import LatencyTable, ModelChain, stage_ms
from services.optimizer.exit_wrapper import best_chain, stage_choices, stage_ramps

# Blocks cost 1 ms per sample (measured at 1 and 8), so what a ramp saves is easy to count.
LINEAR = [[1.0, 8.0]] * 3


def table(heads: list[list[float]], blocks: list[list[float]] = LINEAR) -> LatencyTable:
    return LatencyTable.build((1, 8), blocks, heads)


def test_a_ramp_that_costs_more_than_it_saves_is_off_and_the_cut_stays():
    # sites after blocks 0 and 1; stage = blocks 0..1, ending at the cut (site 1)
    chain = ModelChain(3, (0, 1), (0.9, 0.5))
    # site 0 lets 10 % out: block 1 then runs 7.2 samples instead of 8, saving 0.8 ms;
    # its head costs 2 ms at batch 8. The cut's head costs 5 ms and still runs.
    t = table([[0.25, 2.0], [0.625, 5.0]])
    ch = stage_ramps(chain, t, 0, 1, 8)
    assert ch.active == (1,) and ch.disabled == (0,)
    assert ch.stage_ms == pytest.approx(8 + 8 + 5)
    # a head of 0.1 ms pays: 0.8 ms saved on block 1, and the cut's head runs on 7.2 samples
    cheap = table([[0.0125, 0.1], [0.625, 5.0]])
    ch = stage_ramps(chain, cheap, 0, 1, 8)
    assert ch.active == (0, 1) and ch.disabled == ()
    head_cut = cheap.heads_at(7.2)[1]  # 0.625 + 6.2 / 7 × 4.375 = 4.5
    assert head_cut == pytest.approx(4.5)
    assert ch.stage_ms == pytest.approx(8 + 0.1 + 7.2 + 4.5)


def test_a_ramp_after_the_last_block_saves_nothing():
    chain = ModelChain(3, (0, 2), (0.5, 0.2))
    ch = stage_ramps(chain, table([[0.0, 0.0], [0.001, 0.01]]), 0, 2, 8)
    # site 0 is free and halves blocks 1 and 2; site 2 (after the last block) only costs
    assert ch.active == (0,) and ch.disabled == (1,)
    assert ch.stage_ms == pytest.approx(8 + 4 + 4)


def test_without_the_wrapper_every_ramp_runs():
    chain = ModelChain(3, (0, 1), (0.9, 0.5))
    t = table([[0.25, 2.0], [0.625, 5.0]])
    ch = stage_ramps(chain, t, 0, 2, 8, keep_all=True)
    assert ch.active == (0, 1) and ch.disabled == ()
    assert ch.stage_ms == pytest.approx(stage_ms(chain, t, 0, 2, 8, (0, 1)))


def test_the_rule_weighs_ramps_together():
    # site 0 lets 80 % out; site 1 lets only one more percent out after it. Alone, site 1
    # would save 2 × 6.48 ms on blocks 2 and 3 (8 → 1.52 samples), far above its 0.5 ms
    # head, but behind site 0 it saves 2 × 0.08 ms and its head, on 1.6 samples, costs
    # 0.3 + 0.6 / 7 × 0.2 ms: it is switched off.
    chain = ModelChain(4, (0, 1), (0.2, 0.19))
    t = table([[0.0625, 0.5], [0.3, 0.5]], [[1.0, 8.0]] * 4)
    ch = stage_ramps(chain, t, 0, 3, 8)
    assert ch.active == (0,) and ch.disabled == (1,)
    assert ch.stage_ms == pytest.approx(8 + 0.5 + 1.6 * 3)
    both = stage_ms(chain, t, 0, 3, 8, (0, 1))
    assert both == pytest.approx(8 + 0.5 + 1.6 + (0.3 + 0.6 / 7 * 0.2) + 1.52 * 2)
    alone = stage_ms(chain, t, 0, 3, 8, (1,))
    assert alone == pytest.approx(8 + 8 + 0.5 + 1.52 * 2)
    assert alone < stage_ms(chain, t, 0, 3, 8, ())


def test_a_stage_starts_after_its_cut_and_sees_the_fused_batch():
    chain = ModelChain(4, (0, 1, 2), (0.5, 0.25, 0.1))
    t = table([[0.0, 0.0]] * 3, [[1.0, 8.0]] * 4)
    ch = stage_ramps(chain, t, 1, 3, 8)  # after the cut at site 0: survival 0.5 fused to 8
    # site 1 halves the batch (0.25 / 0.5), site 2 leaves 0.1 / 0.5 of it
    assert ch.active == (1, 2)
    assert ch.stage_ms == pytest.approx(8 + 4 + 1.6)


def test_stages_end_at_a_cut_or_at_the_model_end():
    chain = ModelChain(3, (0,), (0.5,))
    t = table([[0.0, 0.0]])
    assert sorted(stage_choices(chain, t, 0, 8)) == [0, 2]
    with pytest.raises(ValueError):
        stage_ramps(chain, t, 0, 1, 8)
    with pytest.raises(ValueError):
        stage_ramps(chain, t, 2, 2, 8)  # block 1 has no ramp: nothing starts at block 2


def test_best_chain_on_matrices():
    # entry, two ramps: going straight to ramp 2 (7) beats going through ramp 1 (3 + 5)
    inf = np.inf
    seg = np.array([[inf, 2.0, 6.0], [inf, inf, 4.0], [inf, inf, inf]])
    head = np.array([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    best, parent, count = best_chain(seg, head)
    assert list(best) == [0.0, 3.0, 7.0] and list(parent) == [-1, 0, 0]
    assert list(count) == [0, 1, 1]
    best, parent, _ = best_chain(seg, head, keep_all=True)
    assert list(best) == [0.0, 3.0, 8.0] and list(parent) == [-1, 0, 1]


@pytest.mark.parametrize("seed", range(12))
def test_the_choice_is_the_fastest_subset_and_every_kept_ramp_pays(seed):
    rng = np.random.default_rng(seed)
    n_blocks = int(rng.integers(3, 7))
    sites = tuple(sorted(rng.choice(n_blocks, size=int(rng.integers(1, n_blocks)), replace=False)))
    surv = tuple(np.minimum.accumulate(rng.uniform(0.0, 1.0, len(sites))))
    one = rng.uniform(0.5, 3.0, n_blocks)
    blocks = np.stack([one, one * rng.uniform(1.5, 3.0, n_blocks), one * rng.uniform(3, 9, n_blocks)], 1)
    h = rng.uniform(0.0, 1.5, len(sites))
    t = LatencyTable.build((1, 4, 16), blocks, np.stack([h, 2 * h, 5 * h], 1))
    chain = ModelChain(n_blocks, sites, surv)
    batch = int(rng.integers(1, 20))
    ends = {a: i for i, a in enumerate(chain.ramp_after)}
    for last, ch in stage_choices(chain, t, 0, batch).items():
        cut = [ends[last]] if last in ends and last < n_blocks - 1 else []
        inside = [i for i, a in enumerate(chain.ramp_after) if a <= last and i not in cut]
        times = {sub: stage_ms(chain, t, 0, last, batch, (*sub, *cut))
                 for k in range(len(inside) + 1) for sub in combinations(inside, k)}
        assert ch.stage_ms == pytest.approx(min(times.values()), rel=1e-9)
        assert ch.stage_ms == pytest.approx(stage_ms(chain, t, 0, last, batch, ch.active))
        assert set(cut) <= set(ch.active)
        assert sorted((*ch.active, *ch.disabled)) == sorted((*inside, *cut))
        kept = tuple(s for s in ch.active if s not in cut)
        for s in kept:  # switching a kept ramp off costs more than its head
            assert times[tuple(r for r in kept if r != s)] > ch.stage_ms
