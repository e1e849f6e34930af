"""A client that leaves while its request's media are decoded stops that work: before the next
image or clip, and while it waits for a decode turn (VL_MEDIA_DECODES), within a fraction of a
second, as a `Cancelled` (499) error; a client that stays is served as before."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import png_bytes, scene
from vlservice.config import Settings
from vlservice.engine.media import images as imgs
from vlservice.engine.media import video as vid
from vlservice.engine.media.prepare import GONE_CHECK_S, MediaPreparer
from vlservice.engine.types import ImageInput
from vlservice.errors import Cancelled


def preparer(**settings) -> MediaPreparer:
    return MediaPreparer(Settings(media_decodes=1, **settings), imgs.ImageSpec(), vid.VideoSpec(), imgs.Limits(),
                         vid.Limits(), lambda: 1)


def test_no_more_media_are_decoded_once_the_client_left():
    media = [ImageInput(png_bytes(scene(seed=i)), param=f"messages[0].content[{i}]") for i in range(4)]
    p = preparer()
    decoded = []
    real = p.image
    p.image = lambda img, budget, gone: decoded.append(img.param) or real(img, budget, gone)
    prepared, keys, _ = p.prepare(media, "fp", "enc")
    assert len(prepared) == len(keys) == 4
    decoded.clear()
    with pytest.raises(Cancelled):
        p.prepare(media, "fp", "enc", gone=lambda: len(decoded) >= 1)
    assert decoded == ["messages[0].content[0]"]


def test_a_request_waiting_for_a_decode_turn_stops_when_its_client_leaves():
    p = preparer(queue_timeout_s=60)
    media = [ImageInput(png_bytes(scene()))]
    left = threading.Event()
    with p.decode_turn():  # another request holds the only turn
        threading.Timer(0.3, left.set).start()
        t = time.monotonic()
        with pytest.raises(Cancelled) as exc:
            p.prepare(media, "fp", "enc", gone=left.is_set)
        assert time.monotonic() - t < 0.3 + 3 * GONE_CHECK_S
    assert exc.value.status == 499
    assert len(p.prepare(media, "fp", "enc")[0]) == 1  # the turn is free again
