"""The image sizes a request's grounding is converted to, from the real tiny service: each image as
the server decoded it (a phone photo's EXIF orientation applied), in request order, whatever the
model's resized input was."""

from __future__ import annotations

import io

import numpy as np

from vlservice.engine.output.grounding import grounding, parse
from vlservice.engine.types import ChatRequest, ImageInput, Message, Sampling

from conftest import png_bytes, scene


def rotated_jpeg(h: int, w: int) -> bytes:
    """A JPEG stored h x w whose EXIF says to show it turned a quarter (so w x h upright)."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(scene(h, w, seed=5))).save(buf, format="JPEG", exif=exif)
    return buf.getvalue()


def test_image_sizes_are_the_decoded_images(service_for):
    svc = service_for("onnx-int8")
    request = ChatRequest(messages=[Message("user", [ImageInput(png_bytes(scene(90, 300, seed=6))),
                                                     ImageInput(rotated_jpeg(120, 200)), "Where is it?"])],
                          sampling=Sampling(max_tokens=2), result_cache=False)
    gen = svc.submit(request)
    gen.result()
    assert gen.image_sizes == [(300, 90), (120, 200)]  # (width, height); the photo stands upright
    # the model's input is resized to multiples of 32: the answer's pixels are not of that
    assert [p.size for p in gen.work.prepared] != [(90, 300), (200, 120)]
    g = grounding(parse('[{"bbox_2d": [0, 500, 1000, 1000], "label": "lower half"}]'), gen.image_sizes)
    assert g == {"image": 1, "width": 120, "height": 200, "objects": [{"label": "lower half", "box": [0, 100, 120, 200]}]}
