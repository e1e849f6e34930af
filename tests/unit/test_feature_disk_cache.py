"""The vision-feature cache's disk tier through its public API (put, get, stats): bounded in bytes,
the least recently used entries go first, and an entry that cannot be read is a miss and is
deleted. Each check reads with a fresh cache on the same folder, as a restarted server would, and
with no memory tier, so every hit really comes from disk."""

from __future__ import annotations

import numpy as np

from vlservice.engine.caches import FeatureCache
from vlservice.engine.model.vision import VisionFeatures

from conftest import wait_for_a_later_mtime


def feats(value: float) -> VisionFeatures:
    return VisionFeatures(np.full((16, 8), value, np.float32), [np.full((16, 8), -value, np.float32)])


def entry_bytes(tmp_path) -> int:
    """What one entry takes on disk (every entry here has the same shapes)."""
    probe = FeatureCache(0, tmp_path / "probe", 1 << 20)
    probe.put("probe", feats(0.0))
    return probe.stats()["disk_bytes"]


def put_in_order(cache: FeatureCache, keys) -> None:
    for i, key in enumerate(keys):
        cache.put(key, feats(float(i)))
        wait_for_a_later_mtime(cache.disk_dir)  # keep "older" meaningful on disk


def on_disk(folder, keys) -> set:
    reader = FeatureCache(0, folder, 1 << 20)
    return {k for k in keys if reader.get(k) is not None}


def test_over_the_bound_the_oldest_entries_go(tmp_path):
    size = entry_bytes(tmp_path)
    folder = tmp_path / "cache"
    cache = FeatureCache(0, folder, 2 * size + size // 2)  # room for two entries
    put_in_order(cache, ["k0", "k1", "k2", "k3"])
    assert cache.stats()["disk_bytes"] == 2 * size
    assert on_disk(folder, ["k0", "k1", "k2", "k3"]) == {"k2", "k3"}
    assert len(list(folder.glob("*/*.npz"))) == 2


def test_a_read_entry_is_evicted_last(tmp_path):
    size = entry_bytes(tmp_path)
    folder = tmp_path / "cache"
    cache = FeatureCache(0, folder, 2 * size + size // 2)
    put_in_order(cache, ["k0", "k1"])
    got = cache.get("k0")  # read from disk: now the most recently used
    assert got is not None and np.array_equal(got.embeds, feats(0.0).embeds)
    wait_for_a_later_mtime(folder)
    cache.put("k2", feats(2.0))
    assert on_disk(folder, ["k0", "k1", "k2"]) == {"k0", "k2"}


def test_a_restart_keeps_the_bound(tmp_path):
    size = entry_bytes(tmp_path)
    folder = tmp_path / "cache"
    put_in_order(FeatureCache(0, folder, 10 * size), ["k0", "k1", "k2", "k3"])
    smaller = FeatureCache(0, folder, 2 * size + size // 2)  # restarted with a lower VL_DISK_CACHE_MB
    smaller.put("k4", feats(4.0))
    assert smaller.stats()["disk_bytes"] <= 2 * size + size // 2
    assert on_disk(folder, ["k0", "k1", "k2", "k3", "k4"]) == {"k3", "k4"}


def test_a_truncated_entry_is_a_miss_and_is_deleted(tmp_path):
    folder = tmp_path / "cache"
    FeatureCache(0, folder, 1 << 20).put("k0", feats(1.0))
    path = next(folder.glob("*/k0.npz"))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a write cut short
    cache = FeatureCache(0, folder, 1 << 20)
    assert cache.get("k0") is None
    assert not path.exists()
    st = cache.stats()
    assert st["corrupt"] == 1 and st["misses"] == 1 and st["disk_bytes"] == 0
    cache.put("k0", feats(1.0))  # computed again and stored again
    assert np.array_equal(FeatureCache(0, folder, 1 << 20).get("k0").embeds, feats(1.0).embeds)
