"""Grounding on the page, in Chromium: the "Find objects" preset, the answer's boxes and points drawn
over the image (checked pixel by pixel at the boxes' edges), a colour per label, the toggle, the
download, boxes drawn while the answer is still streaming, and on an image the page downscaled
before sending, the boxes at the pixels the API's conversion names.

Until the demo model has learned to locate, the chat endpoint is answered by the test
(Playwright `page.route`) with a stream in the real model's format; the page and its config come
from the real server."""

from __future__ import annotations

import base64
import json

import cv2
import numpy as np
import pytest

from conftest import ARTIFACTS, png_bytes
from vlservice.demo.prompts import PROMPTS
from vlservice.engine.output.grounding import grounding, parse

pytestmark = [pytest.mark.browser, pytest.mark.server]

CHAT = "**/v1/chat/completions"
# The first two of the page's label colours (static/js/grounding.js COLOURS), as RGB.
RED, GREEN = (0xE6, 0x19, 0x4B), (0x3C, 0xB4, 0x4B)
WHITE = (255, 255, 255)
# Qwen3-VL's answer to the locate question, cut into pieces the way tokens cut it.
ANSWER = ['```json\n[\n\t{"bbox', '_2d": [250, 250, 75', '0, 750], "label": "squ', 'are"},\n\t{"bbox_2d": [',
          '50, 600, 200, 900], "label": "cir', 'cle"},\n\t{"point_2d": [600, 100], ', '"label": "square"}\n]\n```']


def sse(pieces, grounding_field=None) -> str:
    def chunk(delta, finish=None, **extra):
        return {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": "demo",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}

    events = [chunk({"role": "assistant", "content": ""}), *(chunk({"content": p}) for p in pieces),
              chunk({}, "stop", **({"grounding": grounding_field} if grounding_field else {}))]
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def route_answer(page, pieces, sizes=None) -> list[dict]:
    """Answer the page's chat requests with `pieces`; returns the requests' bodies."""
    bodies = []

    def reply(route):
        body = json.loads(route.request.post_data)
        bodies.append(body)
        field = grounding(parse("".join(pieces)), sizes) if sizes else None
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
                      body=sse(pieces, field))

    page.route(CHAT, reply)
    return bodies


def open_page(browser, server, lang="en", **kw):
    page = browser.new_page(device_scale_factor=1, **kw)
    page.goto(server.url + "/")
    page.evaluate(f"localStorage.setItem('vlservice.lang', '{lang}')")
    page.reload()
    page.wait_for_selector("#presets button")
    return page


def sent_image(body) -> np.ndarray:
    url = body["messages"][-1]["content"][0]["image_url"]["url"]
    data = np.frombuffer(base64.b64decode(url.split(",", 1)[1]), np.uint8)
    return cv2.imdecode(data, cv2.IMREAD_COLOR)[:, :, ::-1]  # RGB


def near(rgb, expected, tol=10) -> bool:
    return all(abs(int(a) - b) <= tol for a, b in zip(rgb, expected))


def screenshot(locator) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(locator.screenshot(), np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]


def white_png(tmp_path, w, h, name="white.png"):
    path = tmp_path / name
    path.write_bytes(png_bytes(np.full((h, w, 3), 255, np.uint8)))
    return path


def test_find_objects_draws_boxes_over_the_image(server, browser, tmp_path):
    page = open_page(browser, server, viewport={"width": 1280, "height": 900})
    bodies = route_answer(page, ANSWER, [(320, 200)])
    page.set_input_files("#file-input", str(white_png(tmp_path, 320, 200)))
    page.wait_for_selector("#preview:not([hidden])")
    assert page.inner_text('#presets button[data-preset="locate"]') == "Find objects"
    page.click('#presets button[data-preset="locate"]')  # with an image, a preset sends at once
    page.wait_for_selector('#state[data-state="done"]')
    assert bodies[0]["messages"][-1]["content"][-1]["text"] == PROMPTS["en"]["locate"]
    assert page.inner_text(".msg.assistant .content") == "".join(ANSWER)  # the text stays as it came

    stage = page.locator(".msg.assistant .grounding-stage")
    shot = screenshot(stage)
    ARTIFACTS.mkdir(exist_ok=True)
    cv2.imwrite(str(ARTIFACTS / "grounding.png"), shot[:, :, ::-1])
    # The image sent (320x200) is shown at its own size; the element may sit at a fractional
    # position, so its screenshot can hold one more row or column: find where the image starts
    # from the top edge of "square" (y 50, from 250/1000 of 200) and its left edge (x 80).
    assert shot.shape[0] - 200 in (0, 1) and shot.shape[1] - 320 in (0, 1)
    dy = next(y for y in range(shot.shape[0]) if near(shot[y, 160], RED)) - 49
    dx = next(x for x in range(shot.shape[1]) if near(shot[100 + dy, x], RED)) - 79
    assert dy in (0, 1) and dx in (0, 1)

    def at(img, x, y):
        return img[y + dy, x + dx]

    # "square" [250, 250, 750, 750] -> x 80..240, y 50..150: its edges red, beside them white
    for x, y in [(80, 100), (240, 100), (160, 150), (79, 120), (239, 120), (200, 50)]:
        assert near(at(shot, x, y), RED), (x, y, at(shot, x, y))
    for x, y in [(74, 100), (86, 100), (234, 100), (246, 100), (160, 144), (160, 156), (160, 100), (200, 44)]:
        assert near(at(shot, x, y), WHITE), (x, y, at(shot, x, y))
    # "circle" [50, 600, 200, 900] -> x 16..64, y 120..180: another label, another colour
    assert near(at(shot, 16, 150), GREEN) and near(at(shot, 64, 150), GREEN) and near(at(shot, 40, 180), GREEN)
    assert near(at(shot, 40, 150), WHITE)
    # the point labelled "square" again ([600, 100] -> 192, 20) is red: a colour per label
    assert near(at(shot, 192, 20), RED)

    page.uncheck(".grounding-toggle input")  # hidden: the image alone
    hidden = screenshot(stage)
    assert near(at(hidden, 80, 100), WHITE) and near(at(hidden, 16, 150), WHITE) and near(at(hidden, 192, 20), WHITE)

    with page.expect_download() as info:  # the download has the boxes, hidden or not
        page.click(".grounding-download")
    path = tmp_path / "download.png"
    info.value.save_as(path)
    saved = cv2.imread(str(path), cv2.IMREAD_COLOR)[:, :, ::-1]
    assert saved.shape[:2] == (200, 320)
    assert near(saved[100, 80], RED) and near(saved[100, 160], WHITE) and near(saved[150, 64], GREEN)
    page.close()


def test_no_image_no_boxes(server, browser):
    page = open_page(browser, server)
    route_answer(page, ANSWER)
    page.fill("#question", "Where is the square?")
    page.click("#send")
    page.wait_for_selector('#state[data-state="done"]')
    assert page.locator(".grounding").count() == 0  # coordinates of no image are left as text
    page.close()


def test_boxes_are_drawn_while_the_answer_streams(server, browser):
    """The overlay fed the answer piece by piece (as the page feeds it each chunk): a box is on the
    canvas once its closing brace has arrived, before the rest of the answer."""
    page = open_page(browser, server)
    result = page.evaluate("""async (pieces) => {
      const { createOverlay } = await import('/static/js/grounding.js');
      const c = document.createElement('canvas'); c.width = 200; c.height = 100;
      const g = c.getContext('2d'); g.fillStyle = '#fff'; g.fillRect(0, 0, 200, 100);
      const bubble = document.createElement('div'); document.body.append(bubble);
      const overlay = createOverlay(bubble, c.toDataURL('image/png'));
      const seen = [];
      for (const p of pieces) {
        overlay.feed(p);
        const canvas = bubble.querySelector('.grounding-stage canvas');
        // the image loads once, then every piece redraws at once: wait for that first drawing
        for (let i = 0; canvas && canvas.width !== 200 && i < 200; i++) await new Promise((r) => setTimeout(r, 10));
        const px = (x, y) => canvas ? Array.from(canvas.getContext('2d').getImageData(x, y, 1, 1).data) : null;
        seen.push({items: overlay.items.length, square: px(50, 50), circle: px(10, 75)});
      }
      return seen;
    }""", ANSWER)
    assert [s["items"] for s in result] == [0, 0, 0, 1, 1, 2, 3]
    assert result[2]["square"] is None  # nothing drawn (no figure) before the first object is whole
    assert near(result[3]["square"][:3], RED) and result[3]["circle"][3] == 0  # square drawn, circle not yet
    assert near(result[5]["circle"][:3], GREEN)
    page.close()


# Model-style answers and broken ones: the page's parser must find what the server's finds.
TEXTS = ["".join(ANSWER),
         'Found it: {"label": "红色圆形", "bbox_2d": [1.5, 2, 3, 4.25]} and {"point_2d": [5, 6]}.',
         '[{"bbox_2d": [1, 2, 3, 4], "label": "a } { b"}, {"point_2d": [5, 6], "label": "say \\"hi\\""}]',
         '{"objects": [{"bbox_2d": [1, 2, 3, 4], "attrs": {"c": "r"}}]}',
         '{"bbox_2d": [1, 2, 3, 4], "label": "never closed\n[{"point_2d": [5, 6], "label": "ok"}]',
         "{'bbox_2d': [1, 2, 3, 4]} {\"bbox_2d\": [1, 2, 3, 1001]} {\"bbox_2d\": [true, 2, 3, 4]} }}{{ [1, 2]",
         '{"bbox_2d": [NaN, 2, 3, 4]} {"point_2d": ["1", 2]} {"bbox_2d": [1, 2, 3, 4], "label": null}']


def as_json(items) -> list:
    return [{"kind": i.kind, "coords": list(i.coords), "label": i.label} for i in items]


def test_page_parser_agrees_with_the_server_at_every_cut(server, browser):
    """static/js/grounding.js is the page's copy of the server's parser: the same items from the
    same text, whole or cut in two anywhere (each piece reporting what it completed)."""
    page = open_page(browser, server)
    found = page.evaluate("""async (texts) => {
      const { createParser } = await import('/static/js/grounding.js');
      return texts.map((t) => {
        const cuts = [];
        for (let i = 0; i <= t.length; i++) {
          const p = createParser();
          cuts.push([p.feed(t.slice(0, i)).length, p.feed(t.slice(i)).length, p.items]);
        }
        return cuts;
      });
    }""", TEXTS)
    for text, cuts in zip(TEXTS, found):
        whole = as_json(parse(text))
        for cut, (first, second, items) in enumerate(cuts):
            assert items == whole, (text, cut)
            assert first == len(parse(text[:cut])) and first + second == len(whole), (text, cut)
    assert sum(map(len, map(parse, TEXTS))) == 3 + 2 + 2 + 1 + 1 + 0 + 1
    page.close()


def test_downscaled_image_boxes_at_the_pixels_the_api_names(server, browser, tmp_path):
    """A 1600x1000 image goes out downscaled to the server's budget; the boxes are drawn on the image
    the page shows, which is the one it sent, at the pixels the API's conversion gives for it. The
    Chinese page names the preset and the toggle in Chinese."""
    page = open_page(browser, server, "zh", viewport={"width": 1280, "height": 900})
    pieces = ['[{"bbox_2d": [250, 250, 750, 750], "label": "方块"}]']
    bodies = route_answer(page, pieces)
    page.set_input_files("#file-input", str(white_png(tmp_path, 1600, 1000, "big.png")))
    page.wait_for_selector("#preview:not([hidden])")
    assert page.inner_text('#presets button[data-preset="locate"]') == "找出物体"
    page.click('#presets button[data-preset="locate"]')
    page.wait_for_selector('#state[data-state="done"]')
    assert bodies[0]["messages"][-1]["content"][-1]["text"] == PROMPTS["zh"]["locate"]
    h, w = sent_image(bodies[0]).shape[:2]
    assert w * h < 1600 * 1000 and abs(w / h - 1.6) < 0.01  # downscaled, proportions kept
    [obj] = grounding(parse("".join(pieces)), [(w, h)])["objects"]
    x1, y1, x2, y2 = obj["box"]
    canvas = page.evaluate("""() => {
      const c = document.querySelector('.msg.assistant .grounding-stage canvas');
      return {w: c.width, h: c.height};
    }""")
    assert (canvas["w"], canvas["h"]) == (w, h)  # drawn in pixels of the image sent
    px = page.evaluate("""(pts) => {
      const g = document.querySelector('.msg.assistant .grounding-stage canvas').getContext('2d');
      return pts.map(([x, y]) => Array.from(g.getImageData(x, y, 1, 1).data));
    }""", [[x1, (y1 + y2) // 2], [x2, (y1 + y2) // 2], [(x1 + x2) // 2, y2], [(x1 + x2) // 2, (y1 + y2) // 2],
           [x1 - 12, (y1 + y2) // 2]])
    assert all(near(p[:3], RED) and p[3] == 255 for p in px[:3]), px
    assert px[3][3] == 0 and px[4][3] == 0  # inside and outside the box the canvas is clear
    assert page.inner_text(".grounding-toggle span") == "显示标注框"
    page.close()
