"""Per-sequence state of early-exit decoding with deferred KV (Apparate §3.4).

A token that exits at layer ``k`` is emitted at once; its position stops at *depth* ``k``
(the number of transformer layers its hidden state and KV entries have been computed
through) and keeps its hidden state there. Its deeper layers are computed later, batched with
the next token that runs deeper, so every layer's attention reads exact keys and values.

Depths never increase along positions (a later position is never deeper than an earlier
one), so at every layer ``j`` the positions lacking layer-``j`` KV are a contiguous suffix:
the layer's cache holds positions ``0 .. len-1`` in order and the suffix is appended in
order. Hidden states are kept for every position below the *model's* depth (not just the
loaded depth), so loading more layers later can resume from them instead of recomputing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class RowBuffer:
    """Rows appended at the back (and dropped from the front) of a tensor with spare
    capacity, so that appending one position does not copy everything held."""

    def __init__(self) -> None:
        self._data: torch.Tensor | None = None
        self._start = 0
        self._end = 0

    def __len__(self) -> int:
        return self._end - self._start

    def view(self) -> torch.Tensor | None:
        """The rows held (a view; None before the first append)."""
        return None if self._data is None else self._data[self._start:self._end]

    def append(self, rows: torch.Tensor) -> None:
        if self._data is None:
            self._data = rows.new_empty((max(16, rows.shape[0]), *rows.shape[1:]))
        if self._end + rows.shape[0] > self._data.shape[0]:
            held = len(self)
            capacity = max(2 * (held + rows.shape[0]), 16)
            grown = rows.new_empty((capacity, *rows.shape[1:]))
            grown[:held] = self._data[self._start:self._end]
            self._data, self._start, self._end = grown, 0, held
        self._data[self._end:self._end + rows.shape[0]] = rows
        self._end += rows.shape[0]

    def drop_front(self, count: int) -> None:
        self._start += min(count, len(self))

    def nbytes(self) -> int:
        """Bytes of the rows held (the buffer reserves up to twice that for growth)."""
        if self._data is None:
            return 0
        return len(self) * self._data[0].numel() * self._data.element_size()


@dataclass
class Sequence:
    """One request's decoding state.

    ``tokens`` is the prompt followed by every emitted token. Position ``p`` is
    ``tokens[p]`` entered into the model; all but the newest token have entered.
    Layers are 1-based throughout (layer ``j`` is the ``j``-th transformer block).
    """

    request_id: str
    tokens: list[int]
    depths: list[int] = field(default_factory=list)  # per entered position
    # token index -> layer it was emitted at, for tokens emitted below the model's depth
    # whose full-depth answer has not been reported yet
    early: dict[int, int] = field(default_factory=dict)
    keys: list[RowBuffer] = field(default_factory=list)  # per layer: positions x kv_heads x dim
    values: list[RowBuffer] = field(default_factory=list)
    hidden: RowBuffer = field(default_factory=RowBuffer)  # positions pending_start .. entered-1
    pending_start: int = 0

    @property
    def entered(self) -> int:
        """Positions that have entered the model (have a depth)."""
        return len(self.depths)

    def init_layers(self, n_layers: int) -> None:
        self.keys = [RowBuffer() for _ in range(n_layers)]
        self.values = [RowBuffer() for _ in range(n_layers)]

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s keys and values (positions x kv_heads x head_dim, RoPE applied
        to the keys), positions ``0 .. kv_length(layer) - 1`` in order."""
        keys, values = self.keys[layer - 1].view(), self.values[layer - 1].view()
        if keys is None or values is None:
            raise LookupError(f"{self.request_id}: no KV at layer {layer}")
        return keys, values

    def kv_length(self, layer: int) -> int:
        return len(self.keys[layer - 1])

    def append_kv(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys[layer - 1].append(keys)
        self.values[layer - 1].append(values)

    def chunk_start(self, layer: int) -> int:
        """First position lacking layer ``layer`` (positions with depth < layer form the
        suffix from here, as depths never increase along positions)."""
        start = self.entered
        while start > 0 and self.depths[start - 1] < layer:
            start -= 1
        return start

    def enter(self, rows: torch.Tensor) -> None:
        """Positions enter the model: their embeddings, at depth 0."""
        self.hidden.append(rows)
        self.depths.extend([0] * rows.shape[0])

    def hidden_rows(self, start: int, end: int) -> torch.Tensor:
        """Hidden states of positions ``start .. end-1`` at their depths."""
        held = self.hidden.view()
        if held is None or start < self.pending_start:
            raise LookupError(f"{self.request_id}: no hidden state before {self.pending_start}")
        return held[start - self.pending_start:end - self.pending_start]

    def advance(self, start: int, rows: torch.Tensor, depth: int) -> None:
        """Positions ``start ..`` now stand at ``depth`` with hidden states ``rows``."""
        self.hidden_rows(start, start + rows.shape[0]).copy_(rows)
        self.depths[start:start + rows.shape[0]] = [depth] * rows.shape[0]

    def settle(self, n_layers: int) -> None:
        """Forget hidden states of positions that reached the model's full depth."""
        done = self.pending_start
        while done < self.entered and self.depths[done] >= n_layers:
            done += 1
        self.hidden.drop_front(done - self.pending_start)
        self.pending_start = done

    def nbytes(self) -> int:
        """Bytes of KV entries plus held hidden states."""
        return self.hidden.nbytes() + sum(b.nbytes() for b in (*self.keys, *self.values))
