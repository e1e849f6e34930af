"""The shared tier's value format: features go to Redis and come back bit for bit, with their
shapes and dtypes; anything else that a key may hold is refused as corrupt, never decoded into
arrays of the wrong size."""

from __future__ import annotations

import numpy as np
import pytest

from vlservice.engine.caches.shared import CorruptEntry, pack_features, unpack_features
from vlservice.engine.model.vision import VisionFeatures


def features() -> VisionFeatures:
    rng = np.random.default_rng(0)
    return VisionFeatures(embeds=rng.standard_normal((6, 8), dtype=np.float32),
                          deepstack=[rng.standard_normal((6, 8)).astype(np.float16) for _ in range(3)])


def test_round_trip_is_exact():
    feats = features()
    back = unpack_features(pack_features(feats))
    for got, want in zip([back.embeds, *back.deepstack], [feats.embeds, *feats.deepstack]):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)
        assert got.flags.writeable  # a copy, not a view of the Redis reply


def flipped(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


@pytest.mark.parametrize("mangle", [
    lambda d: d[:-5],  # truncated
    lambda d: d + b"x",  # trailing bytes
    flipped,  # one bit of the body
    lambda d: b"XXXX" + d[4:],  # another format
    lambda d: d[:12],  # header cut
    lambda d: b"",
    lambda d: b'{"text": "an answer"}',
])
def test_anything_else_is_corrupt(mangle):
    with pytest.raises(CorruptEntry):
        unpack_features(mangle(pack_features(features())))
