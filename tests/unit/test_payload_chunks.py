"""services.common.payload_chunks: messages under a size limit, nothing lost silently."""

from __future__ import annotations

import pytest

from services.common.payload_chunks import payload_chunks


def _encode(items) -> bytes:
    return "|".join(items).encode()


def test_everything_in_one_message_when_it_fits():
    assert payload_chunks(["a", "b", "c"], _encode, 100) == ([b"a|b|c"], 0)
    assert payload_chunks([], _encode, 100) == ([], 0)


def test_a_burst_is_split_in_order_and_every_message_fits():
    items = [f"r{i:04d}" for i in range(1000)]
    messages, dropped = payload_chunks(items, _encode, 200)
    assert dropped == 0 and len(messages) > 1
    assert all(len(m) <= 200 for m in messages)
    assert b"|".join(messages).decode().split("|") == items  # all of them, in order


def test_an_item_over_the_limit_alone_is_dropped_and_counted():
    messages, dropped = payload_chunks(["a", "x" * 50, "b"], _encode, 10)
    assert dropped == 1 and b"".join(messages) == b"ab"
    with pytest.raises(ValueError):
        payload_chunks(["a"], _encode, 0)
