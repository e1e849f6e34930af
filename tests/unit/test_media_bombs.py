"""Issue 40, media: a progressive JPEG of thousands of scans (libjpeg decodes each over the whole
image: a 156 KB file of 2010 scans took OpenCV 31 s here) is refused from its bytes, before
decoding; a video frame larger than the limit is refused as it is decoded, whatever the
container's header said."""

from __future__ import annotations

import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from vlservice.engine.media import images, video
from vlservice.errors import InvalidImage, VideoTooLarge
from vlservice.tools.edge import jpeg_scan_bomb

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "gray-ramp-h264-10fps-3s.mp4"


def progressive(side: int = 1024) -> bytes:
    img = np.full((side, side, 3), 128, dtype=np.uint8)  # flat: its refinement scans are a few bytes each
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1, cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return buf.tobytes()


def scan_bomb(copies: int, side: int = 1024) -> bytes:
    """A real progressive JPEG with its last scan (SOS to EOI) repeated `copies` times."""
    return jpeg_scan_bomb(copies, side)


def test_a_progressive_jpeg_decodes():
    data = progressive()
    assert 1 < images.jpeg_scans(data, 100) <= 20
    assert images.decode(data).shape == (1024, 1024, 3)


def test_a_jpeg_of_thousands_of_scans_is_refused_before_decoding():
    bomb = scan_bomb(3000, side=4000)
    assert len(bomb) < 1_000_000 and bomb.count(b"\xff\xda") > 3000
    t = time.perf_counter()
    with pytest.raises(InvalidImage) as info:
        images.load(bomb, images.ImageSpec())
    assert time.perf_counter() - t < 0.2
    assert info.value.code == "invalid_image" and "more than 100 scans" in info.value.message
    assert info.value.status == 400


def test_the_scan_cap_is_a_limit():
    bomb = scan_bomb(20)
    with pytest.raises(InvalidImage):
        images.check(bomb, images.Limits(max_jpeg_scans=10))
    images.check(bomb, images.Limits(max_jpeg_scans=40))


def test_a_frame_larger_than_the_limit_is_refused_as_decoded():
    """The container's claim is what `_header` checks; a frame is checked as it is retrieved. Here
    the claim is a 64x64 header, the real clip's frames are larger than a 64x64 limit."""
    cap = video._open(str(FIXTURE), "mp4")
    try:
        claimed = video.Header(64, 64, 10.0, 30)
        with pytest.raises(VideoTooLarge, match="frame 0 of the video is"):
            video._read(cap, claimed, np.arange(4), max_pixels=64 * 64)
    finally:
        cap.release()
