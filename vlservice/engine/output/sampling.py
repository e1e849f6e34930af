"""Choosing the next token: greedy, or temperature / top-k / top-p with a per-request seed;
repetition, frequency and presence penalties; tokens forbidden until `min_tokens`; a grammar's
token mask (`response_format`, constrain.py) before all of them; and, when the request asks
(`logprobs`), the log probabilities of the distribution the token was drawn from."""

from __future__ import annotations

import math

import torch

from ..types import Sampling


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


class Sampler:
    """One request's sampler. Every token it returns becomes the answer's next token (or ends the
    answer), so it counts them itself: the frequency and presence penalties apply to the answer
    only, as OpenAI and vLLM define them, while the repetition penalty covers `seen` (the prompt
    and the answer, as vLLM and llama.cpp do)."""

    def __init__(self, sampling: Sampling, constraint=None):
        self.s = sampling
        self.constraint = constraint  # a `constrain.Constraint`: its mask first, advanced with each token
        self.counts: dict[int, int] = {}  # token -> times in the answer so far
        self.last: tuple[int, float, list[tuple[int, float]]] | None = None  # with `logprobs`: the last token's
        self.gen = None
        if not sampling.greedy:
            self.gen = torch.Generator()
            self.gen.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())

    def __call__(self, logits: torch.Tensor, seen: list[int], forbid: set | None = None) -> int:
        c = self.constraint
        if c is not None:
            if forbid and c.must_end():  # the grammar is complete: its end beats `min_tokens`
                forbid = None
            logits = c.apply(logits)  # a copy: the caller's row is left as it was
        penalised = self._penalised(logits, seen, forbid)
        token = self._choose(penalised)
        if c is not None:
            c.advance(token)
        if self.s.logprobs is not None:
            self.last = self.logprobs(penalised, token)
        self.counts[token] = self.counts.get(token, 0) + 1
        return token

    def logprobs(self, penalised: torch.Tensor, token: int) -> tuple[int, float, list[tuple[int, float]]]:
        """(token, its log probability, the `logprobs` most likely (id, log probability), best first)
        under the distribution this sampler used: the logits after the penalties and the forbidden
        tokens, divided by the temperature (greedy: as they are), before top-k / top-p cut it (as
        vLLM reports them). A forbidden token's -inf is written as -9999.0, as OpenAI does."""
        scaled = penalised if self.s.greedy else penalised / self.s.temperature
        lp = torch.log_softmax(scaled.to(torch.float32), dim=-1)
        k = min(int(self.s.logprobs or 0), lp.shape[-1])
        top: list[tuple[int, float]] = []
        if k:
            values, ids = torch.topk(lp, k)
            top = [(int(i), _finite(float(v))) for i, v in zip(ids, values)]
        return token, _finite(float(lp[token])), top

    def _penalised(self, logits: torch.Tensor, seen: list[int], forbid: set | None) -> torch.Tensor:
        s = self.s
        repeat = s.repetition_penalty != 1.0 and seen
        answer = (s.frequency_penalty or s.presence_penalty) and self.counts
        if not (repeat or answer or forbid):
            return logits
        logits = logits.clone()  # the caller's logits may be kept (the prompt's, for the KV cache)
        if repeat:
            idx = torch.tensor(sorted(set(seen)), dtype=torch.long)
            vals = logits[idx]
            logits[idx] = torch.where(vals > 0, vals / s.repetition_penalty, vals * s.repetition_penalty)
        if answer:
            idx = torch.tensor(list(self.counts), dtype=torch.long)
            n = torch.tensor(list(self.counts.values()), dtype=logits.dtype)
            logits[idx] -= s.frequency_penalty * n + s.presence_penalty
        if forbid:
            logits[list(forbid)] = -math.inf
        return logits

    def _choose(self, logits: torch.Tensor) -> int:
        s = self.s
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
