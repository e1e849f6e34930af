"""The bundled page in a real browser (Debian's Chromium driven by Playwright) against the real
server: upload an image, pick a preset, watch the answer stream in (its states driven by the server's
stage events), the timings and the CPU panel; the presets the page sends are the server's; the API key
stays in the tab. Screenshots are saved to artifacts/ for people to look at."""

from __future__ import annotations

import json
import os

import pytest
import requests

from conftest import ARTIFACTS, png_bytes
from vlservice.demo import prompts

pytestmark = [pytest.mark.browser, pytest.mark.server]

CHAT = "/v1/chat/completions"

# Every value #state's data-state and #messages' aria-busy take, in order: each change's old value
# (a mutation observer runs after the task, so the values at that time would miss the states between).
RECORD = """() => {
  window.seen = {state: [], busy: []};
  const watch = (sel, attr, out) => new MutationObserver((ms) => ms.forEach((m) => out.push(m.oldValue)))
    .observe(document.querySelector(sel), {attributes: true, attributeFilter: [attr], attributeOldValue: true});
  watch('#state', 'data-state', window.seen.state);
  watch('#messages', 'aria-busy', window.seen.busy);
}"""


def open_page(browser, url, lang, **kw):
    page = browser.new_page(**kw)
    page.goto(url + "/")
    page.evaluate(f"localStorage.setItem('vlservice.lang', '{lang}')")
    page.reload()
    page.wait_for_selector("#presets button")  # the presets arrive with /api/config
    return page


def sent_bodies(page) -> list[dict]:
    """The chat requests the page sends, as they leave the browser."""
    bodies = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data)) if r.url.endswith(CHAT) else None)
    return bodies


def seen(page, what: str, selector: str, attr: str) -> list[str]:
    """The values recorded by RECORD and the current one, consecutive repeats dropped."""
    values = page.evaluate(f"window.seen.{what}") + [page.get_attribute(selector, attr)]
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def server_presets(server) -> dict[str, dict[str, str]]:
    return {p["name"]: p for p in requests.get(server.url + "/api/config").json()["presets"]}


def question_of(body: dict) -> str:
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else next(p["text"] for p in content if p["type"] == "text")


def red_circle_png(tmp_path):
    import cv2
    import numpy as np

    img = np.full((160, 200, 3), (235, 232, 220), np.uint8)
    cv2.circle(img, (100, 80), 45, (220, 40, 40), -1, cv2.LINE_AA)  # RGB red
    path = tmp_path / "red-circle.png"
    path.write_bytes(png_bytes(img))
    return path


def test_upload_preset_stream_timings_and_cpu_panel(server, browser, tmp_path):
    page = open_page(browser, server.url, "en", viewport={"width": 1280, "height": 900})
    assert page.inner_text("h1") == "vlservice"
    bodies = sent_bodies(page)
    page.wait_for_selector("#cpu-panel .core-bar", timeout=15000)
    page.set_input_files("#file-input", str(red_circle_png(tmp_path)))
    page.wait_for_selector("#preview:not([hidden])")
    # the estimate shown: a number of image tokens (checked below against the server's count)
    estimate = page.get_attribute("#token-estimate", "data-tokens")
    assert estimate is not None and int(estimate) > 0
    assert f"≈ {estimate} image tokens" in page.inner_text("#token-estimate .tokens")
    page.evaluate(RECORD)
    page.click('#presets button[data-preset="describe"]')
    page.wait_for_selector('#state[data-state="done"]', timeout=120000)
    answer = page.inner_text("#messages .msg.assistant .content").strip()
    assert answer
    if os.environ.get("VL_TEST_MODEL", "demo") == "demo":
        assert answer == "A red circle."  # the demo model's real answer
    # what the page sent: the server's preset, asking for stage events
    assert question_of(bodies[0]) == server_presets(server)["describe"]["en"]
    assert bodies[0]["stream_options"] == {"include_usage": True, "include_stages": True}
    # the states follow the stage events: nothing ahead in the queue, the image encoded, the prompt read
    states = seen(page, "state", "#state", "data-state")
    assert states == ["idle", "sending", "analysing", "prefill", "generating", "done"]
    assert seen(page, "busy", "#messages", "aria-busy") == ["false", "true", "false"]
    assert "ms" in page.inner_text("#timings")
    # the estimate was exact: the server counted as many image tokens for the image the page sent
    assert page.inner_text('#timings [data-key="image_tokens"] .t-value') == estimate
    bars = page.eval_on_selector_all(".core-bar", "els => els.map(e => parseFloat(e.dataset.pct))")
    assert bars and all(0 <= b <= 100 for b in bars)
    # a follow-up about the same image: its features come from the cache (no vision encode)
    page.fill("#question", "What color is the circle?")
    page.keyboard.press("Enter")
    page.wait_for_function("document.querySelectorAll('#messages .msg.assistant').length == 2")
    page.wait_for_selector('#state[data-state="done"]', timeout=120000)
    assert page.get_attribute("#timings", "data-cache-hit") == "true"
    assert page.get_attribute("#messages", "aria-busy") == "false"
    assert question_of(bodies[1]) == "What color is the circle?"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
    page.close()


def test_chinese_ui_presets_and_phone_width(server, browser):
    page = open_page(browser, server.url, "zh", viewport={"width": 375, "height": 800})
    presets = server_presets(server)
    assert list(presets.values()) == prompts.presets()  # the demo model's own questions
    buttons = page.eval_on_selector_all("#presets button", "els => els.map(e => e.dataset.preset)")
    assert buttons == [*(n for n, p in presets.items() if p["media"] == "image"), "free"]  # video ones need a clip
    assert "描述" in page.inner_text("#presets")
    api = page.inner_text("#api-panel")  # the API card, in Chinese, names every route the server answers
    assert "官方客户端" in api and all(route in api for route in ("/v1/chat/completions", "/v1/responses",
                                                                  "/v1/completions", "/v1/messages", "/tokenize"))
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 380  # no sideways scrolling on a phone
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page-phone-zh.png"), full_page=True)
    # without an image a preset only fills the question; sending it sends the server's Chinese prompt
    bodies = sent_bodies(page)
    page.click('#presets button[data-preset="count"]')
    page.click("#send")
    page.wait_for_selector('#state[data-state="done"]', timeout=120000)
    assert question_of(bodies[0]) == presets["count"]["zh"]
    page.close()


def test_sse_parser_follows_the_spec(server, browser):
    """The page's SSE parser, fed a stream cut at awkward places: named events, multi-line data,
    CR / CRLF / LF line ends, comments, a BOM, and a last event without its blank line (dropped)."""
    page = browser.new_page()
    page.goto(server.url + "/")
    events = page.evaluate("""async () => {
      const { createSseParser } = await import('/static/js/api.js');
      const out = [];
      const p = createSseParser((e) => out.push(e));
      const text = '\\ufeff: queued 0\\n\\nevent: vlservice.stage\\r\\ndata: {"stage":"prefill"}\\r\\n\\r\\n'
        + 'data: one\\rdata:two\\r\\rid: 7\\nretry: 10\\n\\nevent: x\\n\\ndata: [DONE]\\n\\ndata: cut';
      for (let i = 0; i < text.length; i += 3) p.push(text.slice(i, i + 3));
      p.end();
      return out;
    }""")
    assert events == [{"type": "vlservice.stage", "data": '{"stage":"prefill"}'},
                      {"type": "message", "data": "one\ntwo"},
                      {"type": "message", "data": "[DONE]"}]
    page.close()


@pytest.fixture(scope="module")
def keyed_server(cache_dir):
    from server import ServerProcess

    env = {"VL_MODEL": os.environ.get("VL_TEST_MODEL", "demo"), "VL_CACHE_DIR": str(cache_dir),
           "VL_API_KEY": "sk-page-" + "5" * 24}
    ARTIFACTS.mkdir(exist_ok=True)
    with ServerProcess(env, ARTIFACTS / "server-page-key.log") as proc:
        proc.key = env["VL_API_KEY"]
        yield proc


def test_api_key_is_asked_for_and_kept_for_the_tab_only(keyed_server, browser):
    context = browser.new_context()
    page = context.new_page()
    page.goto(keyed_server.url + "/")
    page.wait_for_selector("#api-key:not([hidden])")
    # the statistics follow the key (issue 40): without one the panel says so
    page.wait_for_function("document.querySelector('#stats-error').textContent.includes('API key')")
    page.fill("#question", "Hello")
    page.click("#send")  # no key yet: the page asks for it instead of sending
    assert "attention" in page.get_attribute("#api-key-wrap", "class")
    assert page.eval_on_selector_all("#messages .msg", "els => els.length") == 0
    page.fill("#api-key", keyed_server.key)
    page.wait_for_selector("#stats-error", state="hidden", timeout=15000)  # the next poll sends the key
    assert page.evaluate("sessionStorage.getItem('vlservice.apiKey')") == keyed_server.key
    assert page.evaluate("Object.values(localStorage).concat(Object.keys(localStorage))").count(keyed_server.key) == 0
    page.reload()  # same tab: the key is still there
    page.wait_for_selector("#presets button")
    assert page.input_value("#api-key") == keyed_server.key
    headers = []
    page.on("request", lambda r: headers.append(r.headers) if r.url.endswith(CHAT) else None)
    page.fill("#question", "Hello")
    page.click("#send")
    page.wait_for_selector('#state[data-state="done"]', timeout=120000)
    assert headers[0]["authorization"] == f"Bearer {keyed_server.key}"
    other = context.new_page()  # another tab has its own session: no key
    other.goto(keyed_server.url + "/")
    other.wait_for_selector("#presets button")
    assert other.input_value("#api-key") == ""
    context.close()
