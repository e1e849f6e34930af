"""The scheduler's rules without a model: admission by priority and arrival, queue time-outs and
cancels, which sequences share a pass, and how long a prompt's chunk is beside running streams."""

from __future__ import annotations

import pytest

from vlservice.engine.batching import policy
from vlservice.engine.batching.policy import ALONE_CHUNK, FIRST_CHUNK, GAP_STEPS, MIN_CHUNK, SeqState, Waiter, admit, fair_share

NOW, TIMEOUT = 100.0, 30.0


def waiters(*specs) -> list[Waiter]:
    """Waiters in arrival order from (priority name, seconds waited[, cancelled])."""
    return [Waiter(policy.rank(p), i, NOW - waited, *rest) for i, (p, waited, *rest) in enumerate(specs)]


def test_priorities_rank_interactive_first_and_unknown_as_default():
    assert policy.rank("interactive") < policy.rank("default") < policy.rank("batch")
    assert policy.rank("urgent") == policy.rank("default")


def test_free_slots_go_to_the_best_priority_then_first_come():
    queue = waiters(("batch", 1), ("default", 1), ("interactive", 1), ("default", 1), ("interactive", 1))
    assert policy.admit(queue, 3, NOW, TIMEOUT) == ([], [2, 4, 1])
    assert policy.admit(queue, 10, NOW, TIMEOUT) == ([], [2, 4, 1, 3, 0])


@pytest.mark.parametrize("free", [0, -1])
def test_no_free_slot_admits_nobody(free):
    """A full batch (or one over its size, after VL_MAX_BATCH shrank) admits nobody."""
    assert policy.admit(waiters(("interactive", 1)), free, NOW, TIMEOUT) == ([], [])


def test_cancelled_and_timed_out_waiters_leave_without_holding_a_slot():
    queue = waiters(("interactive", TIMEOUT + 1), ("batch", 1), ("default", 1, True), ("batch", 2))
    gone, admit = policy.admit(queue, 1, NOW, TIMEOUT)
    assert gone == [0, 2]
    assert admit == [1]  # the free slot still goes to a live waiter, the earlier batch one


def test_the_gone_leave_even_when_no_slot_is_free():
    assert policy.admit(waiters(("default", TIMEOUT * 2), ("default", 1)), 0, NOW, TIMEOUT) == ([0], [])


def test_leaving_cancel_wins_over_time_out_and_the_limit_itself_is_still_in_time():
    assert policy.leaving(True, TIMEOUT + 5, TIMEOUT) == policy.CANCELLED
    assert policy.leaving(False, TIMEOUT + 0.001, TIMEOUT) == policy.TIMED_OUT
    assert policy.leaving(False, TIMEOUT, TIMEOUT) is None
    assert policy.leaving(False, 0.0, TIMEOUT) is None


def test_ready_with_a_waiter_and_a_slot_or_running_work():
    assert policy.ready(waiting=1, running=3, max_batch=4, runnable=False)
    assert not policy.ready(waiting=1, running=4, max_batch=4, runnable=False)
    assert policy.ready(waiting=1, running=4, max_batch=4, runnable=True)
    assert not policy.ready(waiting=0, running=0, max_batch=4, runnable=False)


def test_a_pass_takes_every_decoding_sequence_and_the_first_prefilling_prompt():
    running = [SeqState(decoding=False, prefilling=False),  # still encoding its images
               SeqState(decoding=True, prefilling=False),
               SeqState(decoding=False, prefilling=True),
               SeqState(decoding=True, prefilling=False),
               SeqState(decoding=False, prefilling=True)]
    assert policy.batch(running) == ([1, 3], 2)
    assert policy.batch([SeqState(True, False)]) == ([0], None)
    assert policy.batch([SeqState(False, True)]) == ([], 0)
    assert policy.batch([SeqState(False, False)]) == ([], None)
    assert policy.batch([]) == ([], None)


def test_decoding_wins_over_prefilling_for_one_sequence():
    """A sequence whose prompt logits were reused decodes at once: its inputs are no prompt chunk."""
    assert policy.batch([SeqState(decoding=True, prefilling=True)]) == ([0], None)


def test_step_time_is_the_nearest_measured_batch_size_smaller_on_a_tie():
    times = {1: [4, 0.4, 0.5, 0, 0.0], 4: [2, 0.6, 0.7, 0, 0.0]}
    assert policy.step_s({}, 2) is None
    assert policy.step_s(times, 1) == pytest.approx(0.1)
    assert policy.step_s(times, 3) == pytest.approx(0.3)  # 4 is nearer
    assert policy.step_s({1: times[1], 3: times[4]}, 2) == pytest.approx(0.1)  # tie: the smaller
    assert policy.step_s({2: [0, 0.0, 0.0, 3, 0.3]}, 2) is None  # cycles counted, no step yet


def test_a_prompt_alone_goes_through_in_big_chunks():
    assert policy.chunk_len(0, 0, None, None) == ALONE_CHUNK
    assert policy.chunk_len(0, 16, 0.1, 0.001) == ALONE_CHUNK
    assert policy.chunk_len(0, 2048, None, None) == 2048


def test_a_fixed_chunk_applies_beside_streams():
    assert policy.chunk_len(3, 16, 0.1, 0.001) == 16
    assert policy.chunk_len(3, 16, None, None) == 16


def test_an_auto_chunk_costs_about_gap_steps_decode_steps():
    step, token = 0.05, 0.001
    assert policy.chunk_len(2, 0, step, token) == int((GAP_STEPS - 1) * step / token)
    assert policy.chunk_len(2, 0, step, 1.0) == MIN_CHUNK  # slow tokens: never below the minimum
    assert policy.chunk_len(2, 0, step, 1e-7) == ALONE_CHUNK  # cheap tokens: never above a lone chunk
    assert policy.chunk_len(2, 0, step, 0.0) == ALONE_CHUNK  # measured as free


def test_the_auto_chunk_is_small_until_both_costs_are_measured():
    assert policy.chunk_len(1, 0, None, 0.001) == FIRST_CHUNK
    assert policy.chunk_len(1, 0, 0.05, None) == FIRST_CHUNK


def test_a_prompt_tokens_cost_is_a_running_mean_of_what_chunks_add_to_a_step():
    first = policy.token_cost(None, spent=0.09, step=0.05, n=40)
    assert first == pytest.approx(0.001)
    assert policy.token_cost(first, spent=0.25, step=0.05, n=40) == pytest.approx(0.8 * 0.001 + 0.2 * 0.005)
    assert policy.token_cost(first, spent=0.01, step=0.05, n=40) == pytest.approx(0.8 * 0.001)  # faster: 0


def test_small_chunks_and_unmeasured_steps_teach_nothing():
    assert policy.token_cost(0.002, spent=1.0, step=0.05, n=MIN_CHUNK - 1) == 0.002
    assert policy.token_cost(0.002, spent=1.0, step=None, n=64) == 0.002
    assert policy.token_cost(None, spent=1.0, step=None, n=64) is None


def test_free_slots_go_round_the_tenants_within_a_priority():
    w = [Waiter(1, i, 0.0, tenant=t) for i, t in enumerate(["a", "a", "a", "b", "a", "c"])]
    # a already runs two: b and c first, then a's oldest
    assert admit(w, 3, 0.0, 60.0, running={"a": 2}).admit == [3, 5, 0]
    # alone, a tenant takes every slot, first come first served
    assert admit(w[:3], 3, 0.0, 60.0).admit == [0, 1, 2]
    # priority still comes first
    w.append(Waiter(0, 9, 0.0, tenant="a"))
    assert admit(w, 1, 0.0, 60.0, running={"a": 5}).admit == [6]


def test_a_fair_share_of_places_is_equal_rounded_up_and_never_zero():
    assert [fair_share(10, n) for n in (0, 1, 2, 3, 4, 20)] == [10, 10, 5, 4, 3, 1]
