"""The sampler on hand-made logits: frequency and presence penalties as OpenAI and vLLM define them
(over the answer only), the repetition penalty over prompt and answer, min_tokens, and the
result-cache key that must tell penalised requests apart."""

from __future__ import annotations

import torch

from vlservice.engine.caches import ResultCache
from vlservice.engine.output.sampling import Sampler
from vlservice.engine.types import Sampling


def logits(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_no_penalty_is_plain_argmax_and_the_callers_logits_stay_untouched():
    sampler = Sampler(Sampling(frequency_penalty=1.0, presence_penalty=1.0, repetition_penalty=1.2))
    x = logits(0.0, 3.0, 2.0)
    before = x.clone()
    assert [sampler(x, [0]) for _ in range(3)] == [1, 2, 1]  # penalties at work ...
    assert torch.equal(x, before)  # ... on a copy: the prompt's logits are kept for the KV cache


def test_frequency_penalty_counts_each_occurrence_in_the_answer():
    # token 1 leads by 2.5: one occurrence costs it 1.0, so it wins twice, then token 2 (2.0 > 5 - 3).
    sampler = Sampler(Sampling(frequency_penalty=1.0))
    x = logits(0.0, 5.0, 2.5)
    assert [sampler(x, []) for _ in range(4)] == [1, 1, 1, 2]
    assert sampler.counts == {1: 3, 2: 1}


def test_presence_penalty_is_paid_once_whatever_the_count():
    sampler = Sampler(Sampling(presence_penalty=1.5))
    x = logits(0.0, 5.0, 4.0)
    assert [sampler(x, []) for _ in range(4)] == [1, 2, 1, 1]  # 5 - 1.5 > 4 - 1.5 from then on


def test_negative_penalties_favour_repeats():
    sampler = Sampler(Sampling(frequency_penalty=-1.0))
    x = logits(4.5, 5.0, 0.0)
    assert [sampler(x, []) for _ in range(3)] == [1, 1, 1]
    sampler = Sampler(Sampling(presence_penalty=-2.0))
    assert [sampler(logits(5.0, 4.0), []), sampler(logits(4.0, 5.0), [])] == [0, 0]


def test_frequency_and_presence_penalties_ignore_the_prompt():
    # `seen` holds the prompt (and the answer): only the repetition penalty looks at it.
    prompt = [1, 1, 1, 1]
    assert Sampler(Sampling(frequency_penalty=2.0, presence_penalty=2.0))(logits(0.0, 5.0), prompt) == 1
    assert Sampler(Sampling(repetition_penalty=10.0))(logits(0.0, 5.0, 1.0), prompt) == 2  # 5 / 10 < 1


def test_penalties_apply_before_sampling_too():
    # With temperature: token 1, 20 times in the answer already, is at 10 - 20 * 2 = -30, far below
    # token 0 (0, then -2, -4, ... as it is drawn): its probability is nil.
    sampler = Sampler(Sampling(temperature=1.0, frequency_penalty=2.0, seed=0))
    sampler.counts = {1: 20}
    assert all(sampler(logits(0.0, 10.0), []) == 0 for _ in range(5))


def test_min_tokens_forbids_end_of_sequence_with_penalties_on():
    sampler = Sampler(Sampling(presence_penalty=0.5))
    assert sampler(logits(0.0, 9.0, 1.0), [], forbid={1}) == 2


def test_tiny_temperatures_are_greedy_instead_of_overflowing():
    s = Sampling(temperature=1e-300, seed=1)
    assert s.greedy and Sampler(s)(logits(1.0, 3.0, 2.0), []) == 1
    assert not Sampling(temperature=1e-3).greedy


def test_result_cache_key_tells_penalties_apart():
    def key(**kw):
        return ResultCache.key("fp", "onnx-int8", [1, 2, 3], ["img"], Sampling(**kw))

    keys = {key(), key(frequency_penalty=0.5), key(presence_penalty=0.5), key(frequency_penalty=0.5,
                                                                               presence_penalty=0.5)}
    assert len(keys) == 4
    assert key(presence_penalty=0.5) == key(presence_penalty=0.5)
