"""The conversation KV cache (`caches/prefix.py`) with real `kv.SeqKV` caches filled by hand:
bounded in bytes with least-recently-used eviction, a branch works on a copy and leaves the stored
conversation whole, and a shared prefix never ends inside an image."""

from __future__ import annotations

import numpy as np
import torch

from vlservice.engine.caches.prefix import MIN_REUSE, PrefixCache, shared_prefix
from vlservice.engine.model.kv import SeqKV

LAYERS, HEADS, DIM = 2, 1, 4


def filled(ids: np.ndarray) -> SeqKV:
    """A cache whose position i holds the value ids[i] in every layer (so a copy can be checked)."""
    kv = SeqKV(LAYERS, HEADS, DIM)
    kv.reserve(len(ids))
    vals = torch.tensor(ids, dtype=torch.float32).view(1, -1, 1).expand(HEADS, len(ids), DIM)
    for layer in range(LAYERS):
        kv.write(layer, vals, -vals)
    kv.advance(len(ids))
    return kv


def conversation(first: int, n: int = 40) -> np.ndarray:
    """Token ids of a conversation: conversations with different `first` share no prefix."""
    return np.arange(first, first + n, dtype=np.int64)


ONE = filled(conversation(0)).nbytes  # every cache below holds one block of positions


def test_bytes_are_the_caches_own():
    a = conversation(0)
    cache = PrefixCache(max_bytes=10 * ONE)
    cache.put(a, [], filled(a))
    assert cache.stats()["bytes"] == ONE > 0


def test_prompt_logits_that_are_a_row_of_a_batch_keep_only_their_row():
    """A prompt's logits come from a pass over the whole batch: stored as they are, the row would
    keep the batch's logits alive while the cache counted one row (memory no budget saw)."""
    a = conversation(0)
    batch = torch.randn(8, 1000)
    cache = PrefixCache(max_bytes=10 * ONE)
    cache.put(a, [], filled(a), prompt_len=len(a), prompt_logits=batch[3])
    (entry,) = cache._entries.values()
    assert entry.prompt_logits.untyped_storage().nbytes() == 1000 * 4 == entry.prompt_logits.nbytes
    assert torch.equal(entry.prompt_logits, batch[3])
    assert cache.stats()["bytes"] == ONE + 1000 * 4


def test_bounded_in_bytes_oldest_evicted():
    cache = PrefixCache(max_bytes=2 * ONE + ONE // 2)  # room for two
    a, b, c = conversation(0), conversation(1000), conversation(2000)
    for ids in (a, b, c):
        cache.put(ids, [], filled(ids))
    st = cache.stats()
    assert st["entries"] == 2 and st["evictions"] == 1 and st["bytes"] == 2 * ONE <= st["capacity_bytes"]
    assert cache.take(a, []) == (None, 0)  # the oldest went
    for ids in (b, c):
        entry, n = cache.take(ids, [])
        assert n == len(ids) and entry.cache.get_seq_length() == len(ids)


def test_a_follow_up_makes_its_conversation_the_most_recent():
    cache = PrefixCache(max_bytes=2 * ONE + ONE // 2)
    a, b, c = conversation(0), conversation(1000), conversation(2000)
    cache.put(a, [], filled(a))
    cache.put(b, [], filled(b))
    entry, n = cache.take(a, [])  # a follow-up on `a`: taken out, extended, stored back
    longer = np.concatenate([a, [7, 8, 9]])
    cache.put(longer, [], filled(longer))
    cache.put(c, [], filled(c))  # over the bound: `b` is now the least recently used
    assert cache.take(b, []) == (None, 0)
    assert cache.take(longer, [])[1] == len(longer)


def test_a_cache_larger_than_the_bound_is_not_kept_and_zero_disables():
    a = conversation(0)
    small = PrefixCache(max_bytes=ONE - 1)
    small.put(a, [], filled(a))
    assert small.stats()["entries"] == 0 and small.take(a, []) == (None, 0)
    off = PrefixCache(max_bytes=0)
    off.put(a, [], filled(a))
    assert off.take(a, []) == (None, 0) and off.stats()["entries"] == 0


def test_a_branch_works_on_a_copy_and_the_stored_conversation_stays_whole():
    long = conversation(0, 60)
    cache = PrefixCache(max_bytes=10 * ONE)
    cache.put(long, [], filled(long))
    branch = np.concatenate([long[:45], [9001, 9002]])  # an edited question after 45 shared tokens
    entry, n = cache.take(branch, [])
    assert n == 45 >= MIN_REUSE
    kv = entry.cache
    kv.truncate(n)  # what the scheduler does, then it writes the branch's tokens over the rest
    new = torch.full((HEADS, 2, DIM), -5.0)
    for layer in range(LAYERS):
        kv.write(layer, new, new)
    kv.advance(2)
    assert kv.get_seq_length() == 47
    stored, m = cache.take(long, [])  # the long conversation is still there, every position intact
    assert m == 60 and stored.cache is not kv and stored.cache.get_seq_length() == 60
    for layer in range(LAYERS):
        assert torch.equal(stored.cache.keys[layer][0, :60, 0], torch.arange(60, dtype=torch.float32))
        assert torch.equal(stored.cache.values[layer][0, :60, 0], -torch.arange(60, dtype=torch.float32))


def test_a_short_shared_prefix_is_a_miss():
    a = conversation(0)
    cache = PrefixCache(max_bytes=10 * ONE)
    cache.put(a, [], filled(a))
    other = np.concatenate([a[:MIN_REUSE - 1], conversation(5000, 10)])  # the chat template's start only
    assert cache.take(other, []) == (None, 0) and cache.stats()["misses"] == 1


def test_shared_prefix_never_ends_inside_an_image():
    a = np.array([1, 2, 9, 9, 9, 3, 4])
    imgs_a = [(2, 5, "x")]
    assert shared_prefix(a, imgs_a, a, imgs_a) == 7
    assert shared_prefix(a, imgs_a, a, [(2, 5, "y")]) == 2  # another image: cut before it
    b = np.array([1, 2, 9, 9, 5])
    assert shared_prefix(a, imgs_a, b, [(2, 4, "x")]) == 2  # differs inside the image run


def test_a_tenant_never_reuses_another_tenants_conversation():
    a = conversation(0)
    cache = PrefixCache(max_bytes=10 * ONE)
    cache.put(a, [], filled(a), tenant="alice")
    longer = np.concatenate([a, conversation(500, 8)])
    assert cache.take(longer, [], "bob") == (None, 0)
    cache.put(longer, [], filled(longer), tenant="bob")
    assert cache.stats()["entries"] == 2  # bob's longer conversation does not replace alice's
    entry, shared = cache.take(longer, [], "alice")
    assert entry is not None and shared == len(a)
