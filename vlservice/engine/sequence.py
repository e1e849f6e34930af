"""One admitted request's state on the model side, between its admission and its last token: its
KV cache, its prompt's progress through prefill, its sampler and text stream. The scheduler
(scheduler.py) is the only one that changes it, on its own thread."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

from .lm import Chunk, SeqPos
from .policy import SeqState
from .sampling import Sampler
from .textstream import TextStream

if TYPE_CHECKING:
    import torch

    from .generation import Generation
    from .kv import SeqKV


class Sequence:
    """One admitted request's state on the model side."""

    def __init__(self, gen: Generation, now: float):
        self.gen = gen
        work = gen.work
        self.prompt = work.prompt
        self.images = work.images
        self.sampling = gen.request.sampling
        self.timings = dict(work.timings)
        self.timings["wait_ms"] = 0.0  # other requests' prefill chunks while this one ran
        self.admitted = now
        self.kv: SeqKV | None = None  # set by admission (the scheduler's `_setup`)
        self.pos = SeqPos()
        self.start = 0  # prompt tokens reused from the conversation's KV cache
        self.cursor = 0  # next prompt token to prefill
        self.needed: list[int] = []  # images after `start`, whose features the prompt needs
        self.encoding: Future | None = None  # the encoder thread's future for them
        # (embeds, positions, visual mask, deepstack) of the prompt from `start`, while it prefills
        self.inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[torch.Tensor] | None] | None = None
        self.prompt_logits: torch.Tensor | None = None
        self.prefill_s = 0.0
        # `response_format`: this sequence's own grammar matcher, built at submission
        constraint = work.constraint
        if constraint is None and self.sampling.grammar:
            constraint = gen.service.grammars.constraint(self.sampling.grammar)
        self.sampler = Sampler(self.sampling, constraint)
        self.stream = TextStream(gen.service.tokenizer, self.sampling.stop)
        self.seen = list(self.prompt.input_ids)
        self.fed = list(self.prompt.input_ids)
        self.n = 0
        self.pending: int | None = None  # the token to feed at the next decode step
        self.logprobs: list[dict] = []  # with `logprobs`: entries of tokens not yet sent with a delta
        self.t_first = 0.0

    @property
    def decoding(self) -> bool:
        return self.pending is not None

    @property
    def state(self) -> SeqState:
        """What the policy needs to place it in the next pass."""
        return SeqState(decoding=self.decoding, prefilling=self.inputs is not None)

    def chunk(self, length: int) -> Chunk:
        """The next `length` prompt tokens (fewer at the end) as a `Chunk`."""
        assert self.inputs is not None and self.kv is not None, "a sequence prefills between `_setup` and its last chunk"
        embeds, positions, visual, deepstack = self.inputs
        a = self.cursor - self.start
        b = min(len(self.prompt) - self.start, a + length)
        mask = chunk_ds = None
        if visual is not None:
            assert deepstack is not None, "the decoder gives the image mask and deepstack together"
            mask = visual[:, a:b]
            before, inside = int(visual[:, :a].sum()), int(mask.sum())
            if inside:
                chunk_ds = [d[before:before + inside] for d in deepstack]
            else:
                mask = None
        return Chunk(self.kv, embeds[:, a:b], positions[:, :, a:b], mask, chunk_ds,
                     logits=self.start + b == len(self.prompt))
