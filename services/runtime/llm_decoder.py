"""Early-exit decoder of a Llama-family causal LM with Apparate's parallel decoding.

Continuous batching over ragged sequences: each ``step`` produces one token for every
sequence. Layer by layer it gathers, for each sequence still running, its *chunk* -- the
positions lacking that layer's KV (tokens that exited earlier and are pending, then the new
token) -- into one ``[rows, hidden]`` batch for the norms, projections and MLP, and runs
attention per sequence against its own cache (causal within the chunk, RoPE at the true
positions). At an exit head whose confidence clears the threshold the new token is emitted
and its sequence leaves the step; its pending positions stop at that layer and catch up
when a later token runs deeper (deferred KV). Every layer-``j`` key is written before any
query reads it, so the result is exactly the full model's computation for every position
that reaches the full depth. When a pending position reaches the last layer its final
logits come for free: they are reported as feedback on the token emitted early after it.

With ``depth`` below the model's layers (partial loading) only layers ``1..depth`` are
touched and the head at ``depth`` answers every token that gets there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from services.runtime.llm_heads import ExitHeads
from services.runtime.llm_kv import Sequence

__all__ = ["DebugLog", "Feedback", "LlmDecoder", "Sequence", "StepResult"]


@dataclass(frozen=True)
class Feedback:
    """The full model's answer for a token that was emitted below the full depth:
    ``tokens[position]`` was emitted at ``exit_layer``; the full model says ``full_token``."""

    position: int
    exit_layer: int
    emitted_token: int
    full_token: int


@dataclass
class StepResult:
    """One emitted token (already appended to its sequence's ``tokens``)."""

    request_id: str
    token: int
    exit_layer: int  # the depth it was emitted at; the model's layer count for the last layer
    confidence: float  # max softmax probability of the distribution it came from
    feedback: list[Feedback] = field(default_factory=list)
    logits: torch.Tensor | None = None  # that distribution's logits, with keep_logits


@dataclass
class DebugLog:
    """What the debug mode checked: every chunk's attention against the cache it reads."""

    checks: int = 0
    violations: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Span:
    """One sequence's chunk inside a layer's gathered batch."""

    index: int  # into the step's sequences
    start: int  # first position of the chunk; the chunk ends at the newest position
    end: int
    row: int  # first row in the batch

    @property
    def rows(self) -> slice:
        return slice(self.row, self.row + self.end - self.start)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlmDecoder:
    """Greedy early-exit decoding of a HF ``LlamaForCausalLM`` with an explicit KV cache."""

    def __init__(self, model: nn.Module, heads: ExitHeads | None, depth: int | None = None,
                 *, keep_logits: bool = False, debug: bool = False) -> None:
        self.model = model.eval()
        self.heads = heads.eval() if heads is not None else None
        self.n_layers = int(model.config.num_hidden_layers)
        self.keep_logits = keep_logits
        self.debug = DebugLog() if debug else None
        self.depth = self.n_layers
        self.set_depth(self.n_layers if depth is None else depth)

    def set_depth(self, depth: int) -> None:
        """Use layers ``1..depth`` from the next step on. Raising it leaves every position
        pending from its current depth: the following steps' chunks carry it through the
        new layers, with the same inputs and causal reads as a full forward, so the catch-up
        is exact. Lowering it trims nothing already computed."""
        if not 1 <= depth <= self.n_layers:
            raise ValueError(f"depth {depth} outside 1..{self.n_layers}")
        if depth < self.n_layers and (self.heads is None or depth not in self.heads):
            raise ValueError(f"partial depth {depth} needs an exit head there")
        self.depth = depth

    @torch.no_grad()
    def prefill(self, seqs: list[Sequence]) -> list[StepResult]:
        """Run new sequences' prompts (``seq.tokens``) through every loaded layer, without
        exits, and emit each one's first token from its last position."""
        for seq in seqs:
            if seq.entered or not seq.tokens:
                raise ValueError(f"{seq.request_id}: prefill needs a fresh, non-empty prompt")
            seq.init_layers(self.n_layers)
            seq.enter(self._embed(seq.tokens))
        return self._run(seqs, {}, allow_exits=False)

    @torch.no_grad()
    def step(self, seqs: list[Sequence], thresholds: dict[int, float]) -> list[StepResult]:
        """Emit one token for every (prefilled, distinct) sequence. ``thresholds[k]``: the
        new token exits at head layer ``k`` when its max softmax probability is at least
        that; missing layers never exit."""
        if len({id(seq) for seq in seqs}) != len(seqs):
            raise ValueError("a sequence appears twice in one step")
        for seq in seqs:
            if not seq.entered or seq.entered != len(seq.tokens) - 1:
                raise ValueError(f"{seq.request_id}: step needs a prefilled sequence")
        if seqs:
            rows = self._embed([seq.tokens[-1] for seq in seqs])
            for seq, row in zip(seqs, rows, strict=True):
                seq.enter(row[None])
        return self._run(seqs, thresholds, allow_exits=True)

    def kv_bytes(self, seq: Sequence) -> int:
        """Bytes a sequence holds: KV entries at every layer plus pending hidden states."""
        return seq.nbytes()

    def weight_bytes(self) -> int:
        """Bytes of the weights used at the loaded depth: embedding (and output embedding
        when untied), the loaded layers, heads up to the depth, final norm."""
        inner = self.model.model
        modules: list[nn.Module] = [inner.embed_tokens, inner.norm, self.model.lm_head]
        modules += list(inner.layers[:self.depth])
        if self.heads is not None:
            modules += [self.heads[k] for k in self.heads.layers if k <= self.depth]
        seen: dict[int, int] = {}
        for module in modules:
            for param in module.parameters():
                seen[param.data_ptr()] = param.numel() * param.element_size()
        return sum(seen.values())

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor(tokens, dtype=torch.long, device=self.model.lm_head.weight.device)
        return self.model.model.embed_tokens(ids)

    def _run(self, seqs: list[Sequence], thresholds: dict[int, float],
             allow_exits: bool) -> list[StepResult]:
        if not seqs:
            return []
        results: list[StepResult | None] = [None] * len(seqs)
        feedback: list[list[Feedback]] = [[] for _ in seqs]
        active = list(range(len(seqs)))
        for layer in range(1, self.depth + 1):
            spans = self._spans(seqs, active, layer)
            x = torch.cat([seqs[s.index].hidden_rows(s.start, s.end) for s in spans])
            x = self._block(layer, x, seqs, spans)
            for s in spans:
                seqs[s.index].advance(s.start, x[s.rows], layer)
            if layer == self.n_layers:
                self._feedback(x, seqs, spans, feedback)
            for index, result in self._answers(layer, x, seqs, spans, thresholds, allow_exits):
                results[index] = result
            active = [i for i in active if results[i] is None]
            if not active:
                break
        for seq, result, notes in zip(seqs, results, feedback, strict=True):
            assert result is not None  # every sequence answers by the loaded depth
            result.feedback = notes
            seq.tokens.append(result.token)
            if result.exit_layer < self.n_layers:
                seq.early[len(seq.tokens) - 1] = result.exit_layer
            seq.settle(self.n_layers)
        return [r for r in results if r is not None]

    def _spans(self, seqs: list[Sequence], active: list[int], layer: int) -> list[_Span]:
        spans, row = [], 0
        for index in active:
            seq = seqs[index]
            start = seq.chunk_start(layer)
            spans.append(_Span(index, start, seq.entered, row))
            row += seq.entered - start
        return spans

    def _block(self, layer: int, x: torch.Tensor, seqs: list[Sequence],
               spans: list[_Span]) -> torch.Tensor:
        """One transformer layer over the gathered chunks (rows x hidden)."""
        block = self.model.model.layers[layer - 1]
        attn = block.self_attn
        rows = x.shape[0]
        positions = torch.cat([torch.arange(s.start, s.end) for s in spans]).to(x.device)
        cos, sin = self.model.model.rotary_emb(x[None], positions[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # rows x 1 x head_dim
        h = block.input_layernorm(x)
        q = attn.q_proj(h).view(rows, -1, attn.head_dim)
        k = attn.k_proj(h).view(rows, -1, attn.head_dim)
        v = attn.v_proj(h).view(rows, -1, attn.head_dim)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        mixed = torch.empty_like(q)
        for s in spans:
            mixed[s.rows] = self._attend(seqs[s.index], layer, s.start,
                                         (q[s.rows], k[s.rows], v[s.rows]), attn.scaling)
        x = x + attn.o_proj(mixed.reshape(rows, -1))
        return x + block.mlp(block.post_attention_layernorm(x))

    def _attend(self, seq: Sequence, layer: int, start: int,
                qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                scale: float) -> torch.Tensor:
        """A chunk's queries (positions start..) against its sequence's layer cache, after
        appending the chunk's keys and values to it."""
        q, k, v = qkv
        if self.debug is not None:
            self._check_reads(seq, layer, start)
        seq.append_kv(layer, k, v)
        keys, values = seq.kv(layer)
        count, held = q.shape[0], keys.shape[0]
        mask = None
        if count > 1:  # key i is visible to the query at position held-count+r when i <= that
            query_pos = torch.arange(held - count, held, device=q.device)
            mask = torch.arange(held, device=q.device)[None, :] <= query_pos[:, None]
        out = nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
            attn_mask=mask, scale=scale, enable_gqa=True)
        return out[0].transpose(0, 1)

    def _check_reads(self, seq: Sequence, layer: int, start: int) -> None:
        """Debug: the query at position p reads keys 0..p of layer ``layer``; those before the
        chunk must already be in the cache (in order), the chunk's are written now."""
        assert self.debug is not None
        self.debug.checks += 1
        where = f"{seq.request_id} layer {layer} chunk {start}..{seq.entered - 1}"
        if seq.kv_length(layer) != start:
            self.debug.violations.append(f"{where}: cache holds {seq.kv_length(layer)}")
        if any(d < layer for d in seq.depths[:start]):
            self.debug.violations.append(f"{where}: reads a key position lacking the layer")
        if any(d != layer - 1 for d in seq.depths[start:]):
            self.debug.violations.append(f"{where}: chunk input not at layer {layer - 1}")

    def _final_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.model.norm(h))

    def _head_logits(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        assert self.heads is not None
        return self.heads[layer](h, self.model.model.norm, self.model.lm_head.weight)

    def _answers(self, layer: int, x: torch.Tensor, seqs: list[Sequence], spans: list[_Span],
                 thresholds: dict[int, float],
                 allow_exits: bool) -> list[tuple[int, StepResult]]:
        """The new tokens answered at this layer: all of them at the loaded depth, else
        those whose head confidence clears the layer's threshold."""
        threshold = thresholds.get(layer, math.inf)
        if layer == self.depth:
            threshold = -math.inf
        elif not (allow_exits and self.heads is not None and layer in self.heads
                  and threshold <= 1.0):
            return []
        last = x[[s.rows.stop - 1 for s in spans]]
        if layer == self.n_layers:
            logits = self._final_logits(last)
        else:
            logits = self._head_logits(layer, last)
        confidence, tokens = logits.float().softmax(-1).max(-1)
        answers = []
        for r, s in enumerate(spans):
            if confidence[r].item() >= threshold:
                kept = logits[r].clone() if self.keep_logits else None
                answers.append((s.index, StepResult(
                    seqs[s.index].request_id, int(tokens[r]), layer,
                    float(confidence[r]), logits=kept)))
        return answers

    def _feedback(self, x: torch.Tensor, seqs: list[Sequence], spans: list[_Span],
                  out: list[list[Feedback]]) -> None:
        """Pending positions that just reached the last layer: the full model's token after
        each one that was followed by an early-emitted token."""
        wanted: list[tuple[int, int, int]] = []  # (sequence index, emitted position, row)
        for s in spans:
            early = seqs[s.index].early
            for p in range(s.start, s.end - 1):  # the newest position answers, not feedback
                if p + 1 in early:
                    wanted.append((s.index, p + 1, s.row + p - s.start))
        if not wanted:
            return
        full = self._final_logits(x[[row for _, _, row in wanted]]).argmax(-1)
        for (index, position, _), token in zip(wanted, full.tolist(), strict=True):
            seq = seqs[index]
            out[index].append(Feedback(position, seq.early.pop(position),
                                       seq.tokens[position], int(token)))
