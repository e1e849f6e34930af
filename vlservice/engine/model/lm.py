"""The language model's forward pass, lean, over several sequences at once.

We run the checkpoint's own modules (norms, projections, MLP, rotary embedding, transformers'
SDPA attention function) in the order `Qwen3VLTextModel.forward` runs them, without what a
server does not need per token: the generic forward's argument handling, mask construction,
output objects and cache bookkeeping. Two shapes of pass:

- `decode(tokens, states)`: one new token for each of B sequences. The projections and the MLP
  see the B rows as one matrix, so the weights are streamed from memory once for all B; attention
  runs per sequence over its own cache (`kv.SeqKV`), since each has its own length.
- `prefill(state, ids, embeds, ...)`: a chunk of one sequence's prompt, with the image features
  scattered into its embeddings and the deepstack features added after the first layers.
- `step(tokens, states, chunk)`: both in one pass, a prompt's chunk beside the running tokens.

At batch 1 the operations are the generic forward's, in its order, on the same shapes: the
logits are the same bits (tests/engine compare them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

from .kv import SeqKV


@dataclass
class SeqPos:
    """Where a sequence is: the next token's text position and its M-RoPE offset."""

    next_pos: int = 0
    delta: int = 0  # M-RoPE position = text position + delta after the last image


class LMRunner(Protocol):
    """What the scheduler and the service call on a language model: PyTorch's `LeanLM` (float32 or
    INT8) or ONNX Runtime's `ortdecode.OrtLM` (int4). Chosen once, when the service starts."""

    embed: torch.nn.Module

    def start(self) -> None:
        """After the fork, before the first pass: thread pools of its own, if any."""

    def new_kv(self, capacity: int = 0) -> SeqKV: ...

    def release(self, kv: SeqKV) -> None: ...

    def decode(self, tokens: list[int], kvs: list[SeqKV], pos: list[SeqPos]) -> torch.Tensor: ...

    def prefill(self, kv: SeqKV, embeds: torch.Tensor, positions: torch.Tensor, visual_mask=None,
                deepstack=None, logits: bool = True): ...

    def step(self, tokens: list[int], kvs: list[SeqKV], pos: list[SeqPos], chunk: "Chunk | None" = None): ...


class LeanLM:
    def __init__(self, model):
        text = model.model.language_model
        cfg = text.config
        self.text = text
        self.layers = list(text.layers)
        self.embed = text.embed_tokens
        self.norm = text.norm
        self.rotary = text.rotary_emb
        self.lm_head = model.lm_head
        self.num_heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.dtype = self.embed.weight.dtype
        # per layer: the fused q/k/v and gate/up products (linears.fuse_int8_projections), if any
        self.fused = [(_fused(layer.self_attn, "q_proj", "k_proj", "v_proj"), _fused(layer.mlp, "gate_proj", "up_proj"))
                      for layer in self.layers]

    def start(self) -> None:
        """Nothing to start: PyTorch's thread pool is the process's (the service sets its size)."""

    def new_kv(self, capacity: int = 0) -> SeqKV:
        return SeqKV(len(self.layers), self.kv_heads, self.head_dim, self.dtype, capacity)

    def release(self, kv: SeqKV) -> None:
        """A sequence left the batch (nothing to do here; see `ortdecode.OrtLM`)."""

    # ----------------------------------------------------------------- passes
    def decode(self, tokens: list[int], kvs: list[SeqKV], pos: list[SeqPos]) -> torch.Tensor:
        """One token for each sequence; returns float32 logits (B, vocab). Advances caches and
        positions."""
        return self.step(tokens, kvs, pos)[0]

    def prefill(self, kv: SeqKV, embeds: torch.Tensor, positions: torch.Tensor, visual_mask=None,
                deepstack=None, logits: bool = True):
        """A chunk of one sequence's prompt (see `Chunk`); returns the next token's float32 logits
        (vocab,) when `logits`."""
        return self.step([], [], [], Chunk(kv, embeds, positions, visual_mask, deepstack, logits))[1]

    @torch.inference_mode()
    def step(self, tokens: list[int], kvs: list[SeqKV], pos: list[SeqPos], chunk: "Chunk | None" = None):
        """One forward pass: a new token for each of B decoding sequences and, with `chunk`, a piece
        of another sequence's prompt, in one pass, so the weights are streamed once for both (vLLM's
        chunked prefill: a prompt's chunk rides along with the running streams' tokens). Returns
        (float32 logits (B, vocab) or None when B = 0, the chunk's next-token logits (vocab,) or
        None). Advances caches and positions.

        All rows go through the projections and the MLP as one (1, B + L, hidden) matrix; attention
        runs per sequence over its own cache. At batch 1 the shapes are the generic forward's."""
        b = len(tokens)
        parts: list[torch.Tensor] = []
        positions: list[torch.Tensor] = []
        segments: list[tuple[SeqKV, int, int, torch.Tensor | None]] = []
        if b:
            parts.append(self.embed(torch.tensor(tokens, dtype=torch.long).view(1, b)))
            positions.append(torch.tensor([s.next_pos + s.delta for s in pos], dtype=torch.long).view(1, 1, b)
                             .expand(3, 1, b))
            for j, kv in enumerate(kvs):
                kv.reserve(kv.length + 1)
                segments.append((kv, j, j + 1, None))
        n = 0
        visual_mask = None
        if chunk is not None:
            n = chunk.embeds.shape[1]
            past = chunk.kv.length
            chunk.kv.reserve(past + n)
            parts.append(chunk.embeds)
            positions.append(chunk.positions)
            mask = None
            if past and n > 1:  # causal over the cached positions and the chunk (bool: True = attend)
                mask = (torch.arange(n)[:, None] + past >= torch.arange(past + n)[None, :]).view(1, 1, n, past + n)
            segments.append((chunk.kv, b, b + n, mask))
            if chunk.visual_mask is not None:
                visual_mask = chunk.visual_mask if not b else torch.cat(
                    [torch.zeros(1, b, dtype=torch.bool), chunk.visual_mask], dim=1)
        hidden = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        p = positions[0] if len(positions) == 1 else torch.cat(positions, dim=2)
        cos, sin = self.rotary(hidden, p)
        hidden = self._layers(hidden, cos, sin, segments, visual_mask, chunk.deepstack if chunk is not None else None)
        for kv, s in zip(kvs, pos):
            kv.advance(1)
            s.next_pos += 1
        if chunk is not None:
            chunk.kv.advance(n)
        rows = list(range(b)) + ([b + n - 1] if chunk is not None and chunk.logits else [])
        if not rows:
            return None, None
        picked = hidden[:, -1:] if rows == [b + n - 1] and b == 0 else hidden[:, rows]
        logits = self.lm_head(self.norm(picked)[0]).float()
        return (logits[:b] if b else None), (logits[b] if len(rows) > b else None)

    def _layers(self, hidden, cos, sin, segments, visual_mask=None, deepstack=None):
        """`hidden` (1, N, hidden); `segments` [(kv, start, end, mask)]: which rows belong to which
        sequence's cache."""
        n = hidden.shape[1]
        shape = (1, n, -1, self.head_dim)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            residual = hidden
            h = layer.input_layernorm(hidden)
            qkv, gate_up = self.fused[i]
            if qkv is None:
                q_, k_, v_ = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
            else:  # one product for the three (the same bits: see linears.fuse_int8_projections)
                q_, k_, v_ = qkv[0](h).split(qkv[1], dim=-1)
            q = attn.q_norm(q_.reshape(shape)).transpose(1, 2)
            k = attn.k_norm(k_.reshape(shape)).transpose(1, 2)
            v = v_.reshape(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            outs = []
            for kv, a, e, mask in segments:
                keys, values = kv.write(i, k[0, :, a:e], v[0, :, a:e])
                o, _ = sdpa_attention_forward(attn, q[:, :, a:e], keys.unsqueeze(0), values.unsqueeze(0), mask,
                                              dropout=0.0, scaling=attn.scaling)
                outs.append(o)
            o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
            hidden = residual + attn.o_proj(o.reshape(1, n, -1).contiguous())
            residual = hidden
            h = layer.post_attention_layernorm(hidden)
            if gate_up is None:
                hidden = residual + layer.mlp(h)
            else:
                mlp = layer.mlp
                g, u = gate_up[0](h).split(gate_up[1], dim=-1)
                hidden = residual + mlp.down_proj(mlp.act_fn(g) * u)
            if deepstack is not None and i < len(deepstack) and deepstack[i] is not None:
                hidden = self.text._deepstack_process(hidden, visual_mask, deepstack[i])
        return hidden


@dataclass
class Chunk:
    """A piece of one sequence's prompt for a forward pass: `embeds` (1, L, hidden) with image
    features already in place, `positions` (3, 1, L) M-RoPE positions, `visual_mask` (1, L) bool
    where the image tokens are and `deepstack` their per-layer features; `logits`: return the next
    token's logits (the prompt's last chunk)."""

    kv: SeqKV
    embeds: torch.Tensor
    positions: torch.Tensor
    visual_mask: torch.Tensor | None = None
    deepstack: list | None = None
    logits: bool = True


def _fused(parent, *names):
    """(fused product, column sizes) when `names` are slices of one fused product, else None."""
    mods = [getattr(parent, n) for n in names]
    fused = getattr(mods[0], "fused", None)
    if fused is None or any(getattr(m, "fused", None) is not fused for m in mods):
        return None
    return fused, [m.out_features for m in mods]
