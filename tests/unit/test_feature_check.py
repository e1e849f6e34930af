"""A feature entry read back from disk is checked against the image's expected grid before use
(`FeatureShape`): the wrong number of tokens, hidden size, deepstack layers or dtype, or values
that are not finite, make it a miss: counted, the first one logged, the file removed, never a
crash. (The Redis tier's check, against a real redis-server: tests/engine/test_shared_cache.py.)"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from vlservice.engine.caches import FeatureCache, FeatureShape
from vlservice.engine.caches import features as features_module
from vlservice.engine.model.vision import VisionFeatures

SHAPE = FeatureShape.of((1, 8, 12), merge_size=2, hidden=16, layers=3)  # 8*12/4 = 24 tokens


def feats(tokens=24, hidden=16, layers=3, dtype=np.float32, fill=0.5) -> VisionFeatures:
    a = np.full((tokens, hidden), fill, dtype)
    return VisionFeatures(embeds=a, deepstack=[a.copy() for _ in range(layers)])


def nan_in_a_deepstack_layer() -> VisionFeatures:
    f = feats()
    f.deepstack[2][5, 7] = np.nan
    return f


def inf_in_the_embeds() -> VisionFeatures:
    f = feats()
    f.embeds[0, 0] = np.inf
    return f


BAD = {
    "too-few-tokens": lambda: feats(tokens=23),
    "too-many-tokens": lambda: feats(tokens=96),  # the grid not merged
    "hidden-size": lambda: feats(hidden=32),
    "a-layer-missing": lambda: feats(layers=2),
    "float64": lambda: feats(dtype=np.float64),
    "float16": lambda: feats(dtype=np.float16),
    "integers": lambda: feats(dtype=np.int32, fill=1),
    "nan": nan_in_a_deepstack_layer,
    "inf": inf_in_the_embeds,
    "3-d": lambda: VisionFeatures(np.zeros((1, 24, 16), np.float32), [np.zeros((24, 16), np.float32)] * 3),
}


def test_the_expected_shape_follows_the_grid():
    assert (SHAPE.tokens, SHAPE.hidden, SHAPE.layers, SHAPE.dtype) == (24, 16, 3, "float32")
    assert FeatureShape.of((4, 6, 10), 2, 2048, 3).tokens == 4 * 6 * 10 // 4  # a clip: every temporal patch
    assert SHAPE.mismatch(feats()) is None


@pytest.mark.parametrize("bad", sorted(BAD))
def test_what_does_not_fit_is_named(bad):
    assert SHAPE.mismatch(BAD[bad]())


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_planted_disk_entry_that_does_not_fit_is_a_miss_and_goes(tmp_path, bad):
    folder = tmp_path / "cache"
    FeatureCache(0, folder, 1 << 20).put("k0", BAD[bad]())  # another process (or anyone) wrote it
    path = next(folder.glob("*/k0.npz"))
    cache = FeatureCache(1 << 20, folder, 1 << 20)
    assert cache.get("k0", SHAPE) is None
    assert not path.exists()
    st = cache.stats()
    assert (st["mismatched"], st["misses"], st["hits"], st["disk_bytes"], st["entries"]) == (1, 1, 0, 0, 0)
    cache.put("k0", feats())  # the encoder's features replace it
    fresh = FeatureCache(0, folder, 1 << 20)
    got = fresh.get("k0", SHAPE)
    assert got is not None and fresh.stats()["mismatched"] == 0 and fresh.stats()["disk_hits"] == 1


def test_a_fitting_disk_entry_is_a_hit_and_unchecked_reads_stay_as_they_were(tmp_path):
    folder = tmp_path / "cache"
    FeatureCache(0, folder, 1 << 20).put("k0", feats())
    got = FeatureCache(0, folder, 1 << 20).get("k0", SHAPE)
    assert got is not None and np.array_equal(got.embeds, feats().embeds)
    FeatureCache(0, folder, 1 << 20).put("k1", feats(tokens=5))
    assert FeatureCache(0, folder, 1 << 20).get("k1") is not None  # no expectation given: no check


def test_only_the_first_mismatch_is_logged(tmp_path, caplog):
    folder = tmp_path / "cache"
    writer = FeatureCache(0, folder, 1 << 20)
    for i in range(3):
        writer.put(f"k{i}", feats(tokens=7))
    cache = FeatureCache(0, folder, 1 << 20)
    with caplog.at_level(logging.DEBUG, logger=features_module.__name__):
        assert all(cache.get(f"k{i}", SHAPE) is None for i in range(3))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "(7, 16)" in warnings[0].getMessage() and "(24, 16)" in warnings[0].getMessage()
    assert cache.stats()["mismatched"] == 3
