"""The bundled page in a real browser (Debian's Chromium driven by Playwright) against the real
server: upload an image, pick a preset, watch the answer stream in, the timings and the CPU panel.
A screenshot is saved to artifacts/ for people to look at."""

from __future__ import annotations

import os

import pytest

from conftest import ARTIFACTS, png_bytes

pytestmark = [pytest.mark.browser, pytest.mark.server]

CHROMIUM = os.environ.get("VL_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def red_circle_png(tmp_path):
    import cv2
    import numpy as np

    img = np.full((160, 200, 3), (235, 232, 220), np.uint8)
    cv2.circle(img, (100, 80), 45, (220, 40, 40), -1, cv2.LINE_AA)  # RGB red
    path = tmp_path / "red-circle.png"
    path.write_bytes(png_bytes(img))
    return path


def test_upload_preset_stream_timings_and_cpu_panel(server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(server.url + "/?lang=en")
    page.evaluate("localStorage.setItem('vlservice.lang', 'en')")
    page.reload()
    page.wait_for_selector("#cpu-panel .core-bar", timeout=15000)
    page.set_input_files("#file-input", str(red_circle_png(tmp_path)))
    page.wait_for_selector("#preview:not([hidden])")
    assert "token" in page.inner_text("#token-estimate").lower()
    seen_states = set()
    page.expose_function("noteState", lambda s: seen_states.add(s))
    page.evaluate("""() => new MutationObserver(() => window.noteState(document.querySelector('#state').dataset.state))
        .observe(document.querySelector('#state'), {attributes: true})""")
    page.click('#presets button[data-preset="describe"]')
    page.wait_for_selector('#state[data-state="generating"], #state[data-state="done"]', timeout=60000)
    page.wait_for_selector('#state[data-state="done"]', timeout=120000)
    answer = page.inner_text("#messages .msg.assistant .content").strip()
    assert answer
    if os.environ.get("VL_TEST_MODEL", "demo") == "demo":
        assert answer == "A red circle."  # the demo model's real answer
    assert "generating" in seen_states or "analysing" in seen_states
    timings = page.inner_text("#timings")
    assert "ms" in timings
    bars = page.eval_on_selector_all(".core-bar", "els => els.map(e => parseFloat(e.dataset.pct))")
    assert bars and all(0 <= b <= 100 for b in bars)
    # a follow-up about the same image: its features come from the cache
    page.fill("#question", "What color is the circle?")
    page.keyboard.press("Enter")
    page.wait_for_function("document.querySelectorAll('#messages .msg.assistant').length == 2")
    page.wait_for_selector('#state[data-state="done"]', timeout=120000)
    assert page.get_attribute("#timings", "data-cache-hit") == "true"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
    page.close()


def test_chinese_ui_and_phone_width(server, browser):
    page = browser.new_page(viewport={"width": 375, "height": 800})
    page.goto(server.url + "/")
    page.evaluate("localStorage.setItem('vlservice.lang', 'zh')")
    page.reload()
    page.wait_for_selector("#presets button")
    assert "描述" in page.inner_text("#presets")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 380  # no sideways scrolling on a phone
    page.screenshot(path=str(ARTIFACTS / "page-phone-zh.png"), full_page=True)
    page.close()


def test_model_output_is_never_html(server, browser):
    """The page must render answers as text: inject markup through the model's own echo path."""
    page = browser.new_page()
    page.goto(server.url + "/")
    page.wait_for_selector("#question")
    page.fill("#question", "<img src=x onerror=window.pwned=1><b>bold</b>")
    page.click("#send")
    page.wait_for_selector('#state[data-state="done"], #state[data-state="error"]', timeout=120000)
    assert page.evaluate("window.pwned === undefined")
    assert page.eval_on_selector_all("#messages b, #messages img", "els => els.length") == 0
    page.close()
