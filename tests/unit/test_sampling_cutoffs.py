"""The sampler's cut-offs on hand-made logits: top-k and top-p keep only the tokens they name, and
a seed gives back the same draws (what `seed` promises API clients). Penalties: test_sampling.py."""

from __future__ import annotations

import torch

from vlservice.engine.output.sampling import Sampler
from vlservice.engine.types import Sampling

# Token 3 is the best, then 7, then 1: close enough that plain sampling at temperature 1 draws all
# three (and the seven others) often.
LOGITS = torch.zeros(10)
LOGITS[3], LOGITS[7], LOGITS[1] = 2.0, 1.8, 1.6
DRAWS = 400


def draws(n: int = DRAWS, **kw) -> list[int]:
    sampler = Sampler(Sampling(temperature=1.0, **kw))
    return [sampler(LOGITS, []) for _ in range(n)]


def test_plain_sampling_draws_beyond_the_best_three():
    # the control: without top-k/top-p the cut-off tests below would pass for another reason
    assert len(set(draws(seed=0))) > 3


def test_top_k_draws_only_the_k_best():
    assert set(draws(top_k=2, seed=1)) == {3, 7}  # both appear, nothing else does


def test_top_p_small_keeps_only_the_best():
    # the best alone holds about 29% of the mass: with top_p 0.1 nothing else is left to draw
    assert set(draws(top_p=0.1, seed=2)) == {3}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.softmax(LOGITS, -1)
    p = float(probs[3] + probs[7]) - 0.01  # the best two are needed to reach p, a third is not
    assert set(draws(top_p=p, seed=3)) == {3, 7}


def test_a_seed_reproduces_the_sequence():
    kw = dict(top_k=5, top_p=0.95, seed=42, n=50)
    assert draws(**kw) == draws(**kw)
    assert draws(**{**kw, "seed": 43}) != draws(**kw)


def test_greedy_ignores_the_seed_and_picks_the_best():
    sampler = Sampler(Sampling(temperature=0.0, seed=5))
    assert {sampler(LOGITS, []) for _ in range(20)} == {3}
