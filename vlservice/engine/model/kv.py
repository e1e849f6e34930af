"""One sequence's KV cache: per layer, keys and values in buffers that grow in blocks.

The scheduler decodes several sequences in one forward pass, each with a cache of its own length,
so a cache is a plain object per sequence rather than one padded batch tensor: appending a token
writes in place (no `torch.cat` of the whole history per token, as a growing `DynamicCache`
does), attention reads a view of the first `length` positions, and the conversation cache
(`caches/prefix.py`) stores, truncates and copies it like any other value.
"""

from __future__ import annotations

import torch

BLOCK = 256  # positions added at a time when a buffer is full


class SeqKV:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype=torch.float32, capacity: int = 0):
        self.layers, self.kv_heads, self.head_dim, self.dtype = layers, kv_heads, head_dim, dtype
        self.length = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.reserve(capacity)

    def get_seq_length(self) -> int:
        return self.length

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions (a follow-up that shares only part of a conversation)."""
        self.length = max(0, min(self.length, length))

    @property
    def nbytes(self) -> int:
        """Bytes held, capacity included (what the conversation cache accounts for)."""
        return sum(t.nbytes for t in self.keys) + sum(t.nbytes for t in self.values)

    def __deepcopy__(self, memo) -> "SeqKV":
        """A copy of the filled part only (a conversation branching off another keeps both)."""
        return self.copy()

    def copy(self, capacity: int = 0) -> "SeqKV":
        """A copy of the filled part, with room for `capacity` positions (a request's other choices
        start from copies of its prompt's cache)."""
        other = SeqKV(self.layers, self.kv_heads, self.head_dim, self.dtype, capacity=max(self.length, capacity))
        for i in range(self.layers):
            other.keys[i][:, :self.length].copy_(self.keys[i][:, :self.length])
            other.values[i][:, :self.length].copy_(self.values[i][:, :self.length])
        other.length = self.length
        return other

    # ----------------------------------------------------------------- filling
    def reserve(self, total: int) -> None:
        """Room for `total` positions (grown in blocks, the filled part kept)."""
        if total <= self.capacity:
            return
        cap = -(-total // BLOCK) * BLOCK
        shape = (self.kv_heads, cap, self.head_dim)
        if not self.keys:
            self.keys = [torch.empty(shape, dtype=self.dtype) for _ in range(self.layers)]
            self.values = [torch.empty(shape, dtype=self.dtype) for _ in range(self.layers)]
        else:
            for store in (self.keys, self.values):
                for i, old in enumerate(store):
                    new = torch.empty(shape, dtype=self.dtype)
                    new[:, :self.length].copy_(old[:, :self.length])
                    store[i] = new
        self.capacity = cap

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `k`, `v` (kv_heads, n, head_dim) after the filled part; returns the keys and values
        of every position so far, as views. `advance(n)` moves the length once all layers wrote."""
        n = k.shape[1]
        end = self.length + n
        self.keys[layer][:, self.length:end].copy_(k)
        self.values[layer][:, self.length:end].copy_(v)
        return self.keys[layer][:, :end], self.values[layer][:, :end]

    def advance(self, n: int) -> None:
        self.length += n
