"""The vision-feature cache and the result cache, on their own (no model): bounded LRUs that keep
their stats, and a disk tier whose stats come from a running account, not a walk of the folder
(the page polls /api/stats every second), while the folder stays within its budget even when
another worker writes to it too."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from vlservice.engine.caches import FeatureCache, ResultCache
from vlservice.engine.model.vision import VisionFeatures

from conftest import wait_for_a_later_mtime


def feats(value: float = 1.0, tokens: int = 4) -> VisionFeatures:
    return VisionFeatures(np.full((tokens, 8), value, np.float32), [np.zeros((tokens, 8), np.float32)])


def on_disk(folder: Path) -> tuple[int, int]:
    files = list(folder.glob("*/*.npz"))
    return sum(p.stat().st_size for p in files), len(files)


def entry_size(tmp_path: Path) -> int:
    probe = FeatureCache(0, tmp_path / "probe", 1 << 20)
    probe.put("k", feats())
    return on_disk(tmp_path / "probe")[0]


def test_memory_tier_is_lru_in_bytes_and_counts_evictions():
    one = feats().nbytes
    cache = FeatureCache(3 * one)
    for i in range(3):
        cache.put(f"k{i}", feats(i))
    assert cache.get("k0") is not None  # k0 is now the most recently used: k1 goes first
    cache.put("k3", feats(3))
    assert cache.get("k1") is None and cache.get("k0") is not None
    cache.put("big", feats(tokens=40))  # larger than the whole tier: not kept, nothing evicted for it
    st = cache.stats()
    assert (st["entries"], st["bytes"], st["capacity_bytes"], st["evictions"]) == (3, 3 * one, 3 * one, 1)
    assert (st["hits"], st["misses"], st["disk_bytes"], st["disk_entries"]) == (2, 1, 0, 0)
    assert cache.get("big") is None


def test_disk_stats_are_a_running_account_not_a_walk(tmp_path, monkeypatch):
    size = entry_size(tmp_path)
    folder = tmp_path / "disk"
    first = FeatureCache(1 << 20, folder, 10 * size)
    for i in range(3):
        first.put(f"a{i}", feats(i))
    cache = FeatureCache(1 << 20, folder, 10 * size)  # a restart: the folder is scanned once
    assert (cache.stats()["disk_bytes"], cache.stats()["disk_entries"]) == on_disk(folder) == (3 * size, 3)

    def no_walk(*args, **kwargs):
        raise AssertionError("the disk tier walked its folder")

    monkeypatch.setattr(Path, "glob", no_walk)
    monkeypatch.setattr(Path, "rglob", no_walk)
    monkeypatch.setattr(os, "scandir", no_walk)
    monkeypatch.setattr(os, "listdir", no_walk)
    for i in range(4):  # under the budget: puts keep the account too
        cache.put(f"b{i}", feats(10 + i))
        for _ in range(50):
            cache.stats()
    monkeypatch.undo()
    assert (cache.stats()["disk_bytes"], cache.stats()["disk_entries"]) == on_disk(folder) == (7 * size, 7)


def test_disk_tier_evicts_the_least_recently_used_and_stays_within_budget(tmp_path):
    size = entry_size(tmp_path)
    folder = tmp_path / "disk"
    cache = FeatureCache(0, folder, 3 * size)  # no memory tier: every hit comes from disk
    for i in range(3):
        cache.put(f"k{i}", feats(i))
        wait_for_a_later_mtime(folder)  # distinct modification times
    assert cache.get("k0") is not None  # read: recently used
    cache.put("k3", feats(3))
    names = sorted(p.stem for p in folder.glob("*/*.npz"))
    assert names == ["k0", "k2", "k3"]
    assert (cache.stats()["disk_bytes"], cache.stats()["disk_entries"]) == on_disk(folder) == (3 * size, 3)
    assert cache.stats()["disk_hits"] == 1


def test_two_workers_on_one_folder_keep_it_within_budget(tmp_path):
    size = entry_size(tmp_path)
    folder = tmp_path / "disk"
    a, b = FeatureCache(0, folder, 4 * size), FeatureCache(0, folder, 4 * size)
    for i in range(6):
        (a if i % 2 else b).put(f"k{i}", feats(i))
        wait_for_a_later_mtime(folder)
    total, count = on_disk(folder)
    assert total <= 4 * size and count == 4
    assert sorted(p.stem for p in folder.glob("*/*.npz")) == ["k2", "k3", "k4", "k5"]  # the newest, whoever wrote them
    assert b.get("k3") is not None  # written by the other worker: a hit, and now in b's account


def test_a_lowered_budget_is_applied_at_start(tmp_path):
    size = entry_size(tmp_path)
    folder = tmp_path / "disk"
    big = FeatureCache(0, folder, 10 * size)
    for i in range(5):
        big.put(f"k{i}", feats(i))
        wait_for_a_later_mtime(folder)
    small = FeatureCache(0, folder, 2 * size)
    assert sorted(p.stem for p in folder.glob("*/*.npz")) == ["k3", "k4"]
    assert (small.stats()["disk_bytes"], small.stats()["disk_entries"]) == (2 * size, 2)


def test_a_vanished_disk_entry_is_a_plain_miss(tmp_path):
    cache = FeatureCache(0, tmp_path, 1 << 20)
    cache.put("k", feats())
    next(tmp_path.glob("*/k.npz")).unlink()  # evicted by another worker
    assert cache.get("k") is None
    st = cache.stats()
    assert (st["corrupt"], st["misses"], st["disk_entries"]) == (0, 1, 0)


def test_result_cache_is_lru_by_entries():
    cache = ResultCache(2)
    cache.put("a", {"text": "A"})
    cache.put("b", {"text": "B"})
    assert cache.get("a") == {"text": "A"}  # a is now the most recently used: b goes first
    cache.put("c", {"text": "C"})
    assert cache.get("b") is None and cache.get("a") and cache.get("c")
    assert cache.stats() == {"entries": 2, "capacity": 2, "hits": 3, "misses": 1, "shared_hits": 0}


def test_result_cache_off():
    cache = ResultCache(0)  # VL_RESULT_CACHE_ENTRIES=0
    cache.put("a", {"text": "A"})
    assert cache.get("a") is None
    assert cache.stats() == {"entries": 0, "capacity": 0, "hits": 0, "misses": 1, "shared_hits": 0}
