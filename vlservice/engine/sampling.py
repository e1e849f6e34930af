"""Choosing the next token: greedy, or temperature / top-k / top-p with a per-request seed;
repetition penalty; tokens forbidden until `min_tokens`."""

from __future__ import annotations

import math

import torch

from .types import Sampling


class Sampler:
    def __init__(self, sampling: Sampling):
        self.s = sampling
        self.gen = None
        if not sampling.greedy:
            self.gen = torch.Generator()
            self.gen.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())

    def __call__(self, logits: torch.Tensor, seen: list[int], forbid: set | None = None) -> int:
        s = self.s
        if s.repetition_penalty != 1.0 and seen:
            idx = torch.tensor(sorted(set(seen)), dtype=torch.long)
            vals = logits[idx]
            logits = logits.clone()
            logits[idx] = torch.where(vals > 0, vals / s.repetition_penalty, vals * s.repetition_penalty)
        if forbid:
            logits = logits.clone()
            logits[list(forbid)] = -math.inf
        if s.greedy:
            return int(torch.argmax(logits))
        logits = logits / s.temperature
        if s.top_k and s.top_k > 0:
            kth = torch.topk(logits, min(s.top_k, logits.shape[-1])).values[-1]
            logits = torch.where(logits < kth, torch.full_like(logits, -math.inf), logits)
        probs = torch.softmax(logits, dim=-1)
        if s.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_probs, dim=-1)
            drop = cum - sorted_probs > s.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
            probs = probs / probs.sum()
        return int(torch.multinomial(probs, 1, generator=self.gen))
