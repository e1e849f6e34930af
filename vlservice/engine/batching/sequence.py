"""One admitted request's state on the model side, between its admission and its last token: its
KV cache, its prompt's progress through prefill, its sampler and text stream; a request of
several choices (OpenAI's `n`) is several sequences, one `Choices`. The scheduler (scheduler.py)
is the only one that changes them, on its own thread."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING

from ..model.lm import Chunk, SeqPos
from .policy import SeqState
from ..output.sampling import Sampler
from ..output.textstream import TextStream

if TYPE_CHECKING:
    import torch

    from ..output.constrain import Grammars
    from .generation import Generation
    from ..model.kv import SeqKV


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index`: the request's `seed + index`, wrapped into the signed 64-bit
    range a request's `seed` takes, so that choice i answers what the same request sent alone with
    that seed answers. No seed: None, each choice drawing from a random stream of its own."""
    if seed is None:
        return None
    return (seed + index + 2**63) % 2**64 - 2**63


class Choices:
    """The sequences answering one request, one per choice, in choice order. The first (the
    leader) prefills the prompt; the others hold their batch slots meanwhile and start from copies
    of its KV cache once its prompt's logits are there (`Sequence.start_from`). The request is
    done when every choice has finished, or over at its first failure."""

    def __init__(self, gen: Generation, now: float, grammars: Grammars, tokenizer):
        self.members = [Sequence(gen, now, self, grammars, tokenizer, i) for i in range(max(1, gen.request.choices))]
        self.count = len(self.members)
        self.finished: dict[int, tuple[str, int]] = {}  # choice -> (finish reason, completion tokens)
        self.over = False  # failed or cancelled: its error was given, its sequences left the batch

    @property
    def leader(self) -> Sequence:
        return self.members[0]

    @property
    def followers(self) -> list[Sequence]:
        """The other choices, not yet started (they wait for the leader's prompt)."""
        return [s for s in self.members[1:] if s.kv is None]

    @property
    def done(self) -> bool:
        return len(self.finished) == self.count

    def close(self) -> None:
        """The request has ended: its sequences and this family let go of each other, so that
        reference counting frees them at once (their grammar matchers, prompt logits, the KV cache
        a sequence still names) rather than the cycle collector some time later. Such cycles piled
        up for minutes under load, longer as the caches grew, and looked like a leak (issue 45)."""
        self.members = []

    def summary(self, timings: dict, now: float) -> tuple[dict, list | None]:
        """Every choice has finished: the request's usage (the prompt once, every choice's tokens)
        and, with several choices, each one's finish, `timings` (the last to finish's) then given
        decode figures over all of them."""
        leader = self.leader
        completion = sum(n for _, n in self.finished.values())
        usage = {"prompt_tokens": len(leader.prompt), "completion_tokens": completion,
                 "total_tokens": len(leader.prompt) + completion}
        if len(self.members) == 1:
            return usage, None
        decode_s = now - leader.t_first
        steps = completion - len(self.members)  # the first tokens came from the prompt's pass
        timings.update({"predicted_n": completion, "predicted_ms": decode_s * 1e3,
                        "predicted_per_second": steps / decode_s if steps > 0 and decode_s > 0 else 0.0})
        return usage, [{"index": i, "finish_reason": self.finished[i][0]} for i in range(len(self.members))]


class Sequence:
    """One admitted request's state on the model side (one choice of it)."""

    def __init__(self, gen: Generation, now: float, family: Choices, grammars: Grammars, tokenizer, choice: int = 0):
        self.gen = gen
        self.family = family
        self.choice = choice
        work = gen.work
        self.prompt = work.prompt
        self.images = work.images
        self.sampling = gen.request.sampling
        if choice:  # its own random stream (sequence.choice_seed)
            self.sampling = replace(self.sampling, seed=choice_seed(self.sampling.seed, choice))
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
        # `response_format`: this sequence's own grammar matcher, built at submission (the other
        # choices: copies of it, untouched yet)
        constraint = work.constraint if work.constraint is None or not choice else work.constraint.copy()
        if constraint is None and self.sampling.grammar:
            constraint = grammars.constraint(self.sampling.grammar)
        self.sampler = Sampler(self.sampling, constraint)
        self.stream = TextStream(tokenizer, self.sampling.stop)
        self.seen = list(self.prompt.input_ids)
        self.fed = list(self.prompt.input_ids)
        self.n = 0
        self.pending: int | None = None  # the token to feed at the next decode step
        self.logprobs: list[dict] = []  # with `logprobs`: entries of tokens not yet sent with a delta
        self.t_first = 0.0

    def start_from(self, leader: Sequence, kv: SeqKV) -> None:
        """Another choice starts where `leader`'s prefill ended: `kv` a copy of its cache, its
        position and what its prompt cost."""
        self.kv, self.pos = kv, SeqPos(leader.pos.next_pos, leader.pos.delta)
        self.start, self.cursor, self.prefill_s = leader.start, leader.cursor, leader.prefill_s
        self.prompt_logits, self.t_first = leader.prompt_logits, leader.t_first
        self.timings = dict(leader.timings)

    def finish_timings(self, now: float) -> None:
        """Its last token is out: what its prompt and answer cost, into its timings."""
        decode_s = now - self.t_first
        n, prompt_n = self.n, len(self.prompt) - self.start
        self.timings.update({
            "prompt_n": prompt_n, "cache_n": self.start, "result_cache_hit": False,
            "prompt_per_second": prompt_n / self.prefill_s if self.prefill_s else 0.0,
            "predicted_n": n, "predicted_ms": decode_s * 1e3,
            "predicted_per_second": (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
            "total_ms": (now - self.gen.work.t_submit) * 1e3,
            "model_ms": (now - self.admitted) * 1e3,
        })
        if self.sampler.constraint is not None:  # `response_format`: what its token masks cost, in all
            self.timings["grammar_mask_ms"] = self.sampler.constraint.mask_s * 1e3

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
