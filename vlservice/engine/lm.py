"""The language model's forward pass, lean, over several sequences at once.

We run the checkpoint's own modules (norms, projections, MLP, rotary embedding, transformers'
SDPA attention function) in the order `Qwen3VLTextModel.forward` runs them, without what a
server does not need per token: the generic forward's argument handling, mask construction,
output objects and cache bookkeeping. Two shapes of pass:

- `decode(tokens, states)`: one new token for each of B sequences. The projections and the MLP
  see a (B, 1, hidden) batch, so the weights are streamed from memory once for all B; attention
  runs per sequence over its own cache (`kv.SeqKV`), since each has its own length.
- `prefill(state, ids, embeds, ...)`: a chunk of one sequence's prompt, with the image features
  scattered into its embeddings and the deepstack features added after the first layers.

At batch 1 the operations are the generic forward's, in its order, on the same shapes: the
logits are the same bits (tests/engine compare them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

from .kv import SeqKV


@dataclass
class SeqPos:
    """Where a sequence is: the next token's text position and its M-RoPE offset."""

    next_pos: int = 0
    delta: int = 0  # M-RoPE position = text position + delta after the last image


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
        # per layer: the fused q/k/v and gate/up products (quant.fuse_int8_projections), if any
        self.fused = [(_fused(layer.self_attn, "q_proj", "k_proj", "v_proj"), _fused(layer.mlp, "gate_proj", "up_proj"))
                      for layer in self.layers]

    def new_kv(self, capacity: int = 0) -> SeqKV:
        return SeqKV(len(self.layers), self.kv_heads, self.head_dim, self.dtype, capacity)

    # ----------------------------------------------------------------- passes
    @torch.inference_mode()
    def decode(self, tokens: list[int], kvs: list[SeqKV], pos: list[SeqPos]) -> torch.Tensor:
        """One token for each sequence; returns float32 logits (B, vocab). Advances caches and
        positions."""
        b = len(tokens)
        hidden = self.embed(torch.tensor(tokens, dtype=torch.long).view(b, 1))
        p = torch.tensor([[s.next_pos + s.delta] for s in pos], dtype=torch.long)  # (B, 1)
        cos, sin = self.rotary(hidden, p.unsqueeze(0).expand(3, b, 1))
        for kv in kvs:
            kv.reserve(kv.length + 1)
        hidden = self._layers(hidden, cos, sin, kvs, [None] * b)
        for kv, s in zip(kvs, pos):
            kv.advance(1)
            s.next_pos += 1
        return self.lm_head(self.norm(hidden)[:, -1]).float()

    @torch.inference_mode()
    def prefill(self, kv: SeqKV, embeds: torch.Tensor, positions: torch.Tensor, visual_mask=None,
                deepstack=None, logits: bool = True):
        """A chunk of one sequence: `embeds` (1, L, hidden) with image features already in place,
        `positions` (3, 1, L) M-RoPE positions, `visual_mask` (1, L) bool where the image tokens
        are and `deepstack` their per-layer features. Returns the next token's float32 logits
        (vocab,) when `logits`."""
        n = embeds.shape[1]
        past = kv.length
        kv.reserve(past + n)
        cos, sin = self.rotary(embeds, positions)
        mask = None
        if past and n > 1:  # causal over the cached positions and the chunk (bool: True = attend)
            mask = (torch.arange(n)[:, None] + past >= torch.arange(past + n)[None, :]).view(1, 1, n, past + n)
        hidden = self._layers(embeds, cos, sin, [kv], [mask], visual_mask, deepstack)
        kv.advance(n)
        if not logits:
            return None
        return self.lm_head(self.norm(hidden[:, -1:])[:, -1]).float()[0]

    def _layers(self, hidden, cos, sin, kvs, masks, visual_mask=None, deepstack=None):
        b, n = hidden.shape[0], hidden.shape[1]
        shape = (b, n, -1, self.head_dim)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            residual = hidden
            h = layer.input_layernorm(hidden)
            qkv, gate_up = self.fused[i]
            if qkv is None:
                q_, k_, v_ = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
            else:  # one product for the three (the same bits: see quant.fuse_int8_projections)
                q_, k_, v_ = qkv[0](h).split(qkv[1], dim=-1)
            q = attn.q_norm(q_.reshape(shape)).transpose(1, 2)
            k = attn.k_norm(k_.reshape(shape)).transpose(1, 2)
            v = v_.reshape(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            outs = []
            for j, kv in enumerate(kvs):
                keys, values = kv.write(i, k[j], v[j])
                o, _ = sdpa_attention_forward(attn, q[j:j + 1], keys.unsqueeze(0), values.unsqueeze(0), masks[j],
                                              dropout=0.0, scaling=attn.scaling)
                outs.append(o)
            o = outs[0] if b == 1 else torch.cat(outs)
            hidden = residual + attn.o_proj(o.reshape(b, n, -1).contiguous())
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


def _fused(parent, *names):
    """(fused product, column sizes) when `names` are slices of one fused product, else None."""
    mods = [getattr(parent, n) for n in names]
    fused = getattr(mods[0], "fused", None)
    if fused is None or any(getattr(m, "fused", None) is not fused for m in mods):
        return None
    return fused, [m.out_features for m in mods]
