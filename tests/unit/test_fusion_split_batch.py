"""A later stage cuts a part at its target batch (services/worker/compute_mode.split_rows):
every per-row field is cut, both halves encode, and fusing them back gives the part."""

from __future__ import annotations

import numpy as np

from schemas.messages import Batch, decode_map
from services.worker.compute_mode import fuse, split_part, split_rows
from services.worker.fusion import FusionBuffer, Part


def part(name: str, rows: int) -> Batch:
    return Batch(name, "m", 2, "offramp.results.r", [f"{name}-{i}" for i in range(rows)], 3,
                 {"x": np.arange(rows * 4, dtype=np.float32).reshape(rows, 2, 2)}, [0, 1],
                 np.arange(2 * rows, dtype=np.int32).reshape(2, rows),
                 np.linspace(0, 1, 2 * rows, dtype=np.float32).reshape(2, rows),
                 np.full(rows, -1, np.int32), [1.5, 2.5],
                 {"attention_mask": np.ones((rows, 3), np.int64) * np.arange(rows)[:, None]},
                 [f"reply-{i}" for i in range(rows)], [float(i) for i in range(rows)],
                 [100.0] * rows)


def test_split_rows_cuts_every_per_row_field_and_fuses_back():
    b = part("a", 5)
    head, rest = split_rows(b, 2)
    assert (head.ids, rest.ids) == (b.ids[:2], b.ids[2:])
    assert head.inputs["x"].shape == (2, 2, 2) and rest.inputs["x"].shape == (3, 2, 2)
    assert head.ramp_pred.shape == (2, 2) and rest.ramp_score.shape == (2, 3)
    assert rest.carry["attention_mask"][:, 0].tolist() == [2, 3, 4]
    assert rest.replies == ["reply-2", "reply-3", "reply-4"] and rest.ages_ms == [2.0, 3.0, 4.0]
    assert (head.batch_id, rest.stage, rest.config_version, rest.stage_ms) == ("a", 2, 3, [1.5, 2.5])
    back, starts = fuse([head, rest])
    assert starts.tolist() == [0, 2] and back.ids == b.ids and back.replies == b.replies
    for got, want in ((back.inputs["x"], b.inputs["x"]), (back.ramp_pred, b.ramp_pred),
                      (back.ramp_score, b.ramp_score), (back.exit_at, b.exit_at),
                      (back.carry["attention_mask"], b.carry["attention_mask"])):
        assert np.array_equal(got, want)
    assert Batch.decode(decode_map(rest.encode())).ids == rest.ids


def test_a_worker_s_fusion_fills_its_target_from_parts_over_half_a_batch():
    buf: FusionBuffer = FusionBuffer(16, 0.0, 1e4, split=split_part)
    for name in "abc":
        buf.add(Part(10, 1.0, 0.0, (part(name, 10), 0.5)))
    got = buf.take(0.0)
    assert [len(b.ids) for b, _ in (p.payload for p in got)] == [10, 6]
    assert sum(len(b.ids) for b, _ in (p.payload for p in buf.parts)) == 14
    assert all(received == 0.5 for _, received in (p.payload for p in got))
