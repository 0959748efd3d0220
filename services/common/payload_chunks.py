"""Split a list of items into encoded messages that each fit a size limit (pure): NATS
refuses a message over its ``max_payload``, and a burst of records can exceed it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def payload_chunks(items: Sequence[T], encode: Callable[[Sequence[T]], bytes], limit: int
                   ) -> tuple[list[bytes], int]:
    """(messages in order, items dropped): ``encode`` of consecutive runs of ``items``,
    each at most ``limit`` bytes, halving a run until it fits; an item that does not fit
    on its own is dropped and counted."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    out: list[bytes] = []
    dropped = 0
    todo = [items] if len(items) else []
    while todo:
        run = todo.pop(0)
        data = encode(run)
        if len(data) <= limit:
            out.append(data)
        elif len(run) == 1:
            dropped += 1
        else:
            half = len(run) // 2
            todo[:0] = [run[:half], run[half:]]
    return out, dropped
