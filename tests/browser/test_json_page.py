"""The page's JSON switch, in Chromium against the real server and the bundled demo model: the
shape-list example sent with an image comes back as an object that validates against the schema and
is shown parsed; an answer cut by max tokens is shown as text with a note; a schema the server
cannot use shows the server's 400 message; a schema that is not JSON is caught before sending; the
example schemas compile on the server. And the model's tool calls, streamed in fragments, shown as
call blocks: until the server has tools, that stream is answered by the test (Playwright
`page.route`) in OpenAI's format; the page and its config come from the real server."""

from __future__ import annotations

import json

import jsonschema
import pytest
import requests

from conftest import ARTIFACTS, png_bytes, scene
from test_page import CHAT, open_page, sent_bodies

pytestmark = [pytest.mark.browser, pytest.mark.server]


def examples(page) -> dict:
    return page.evaluate("async () => (await import('/static/js/structured.js')).EXAMPLES")


def switch_on(page):
    page.check("#json-mode")
    page.wait_for_selector("#json-panel:not([hidden])")


def ask(page, question):
    page.fill("#question", question)
    page.click("#send")


def test_shape_list_schema_with_an_image_is_shown_parsed(server, browser, tmp_path):
    page = open_page(browser, server.url, "en", viewport={"width": 1280, "height": 900})
    bodies = sent_bodies(page)
    image = tmp_path / "shapes.png"
    image.write_bytes(png_bytes(scene(seed=61)))
    page.set_input_files("#file-input", str(image))
    page.wait_for_selector("#preview:not([hidden])")
    assert page.is_hidden("#json-panel")
    switch_on(page)
    page.select_option("#json-example", "shapes")
    schema = examples(page)["shapes"]["schema"]
    assert json.loads(page.input_value("#json-schema")) == schema
    page.fill("#max-tokens", "400")
    ask(page, "List the shapes in this image.")
    page.wait_for_selector('#state[data-state="done"]', timeout=180000)
    fmt = bodies[0]["response_format"]
    assert fmt == {"type": "json_schema", "json_schema": {"name": "shapes", "schema": schema}}
    assert bodies[0]["messages"][-1]["content"][0]["type"] == "image_url"
    bubble = page.locator("#messages .msg.assistant").last
    assert bubble.get_attribute("data-json") == "parsed", bubble.inner_text()
    shown = json.loads(bubble.locator(".json-view").inner_text())
    jsonschema.validate(shown, schema)
    assert set(shown) == {"shapes", "count"}
    assert all(set(s) == {"shape", "color"} for s in shown["shapes"])
    assert bubble.locator(".content").is_hidden()  # the parsed object instead of the raw text
    assert page.inner_text(".json-view").startswith("{\n  ")  # pretty-printed
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page-json.png"), full_page=True)
    page.close()


def test_cut_answer_is_shown_as_text_with_a_note(server, browser):
    page = open_page(browser, server.url, "zh")
    bodies = sent_bodies(page)
    switch_on(page)  # no schema: any JSON object
    page.fill("#max-tokens", "3")
    ask(page, "Describe a red circle as JSON.")
    page.wait_for_selector('#state[data-state="done"]', timeout=120000)
    assert bodies[0]["response_format"] == {"type": "json_object"}
    bubble = page.locator("#messages .msg.assistant").last
    assert bubble.get_attribute("data-json") == "unparsed"
    assert bubble.locator(".content").inner_text().startswith("{")
    assert bubble.locator(".json-view").count() == 0
    assert "最大 token 数" in bubble.locator(".json-note").inner_text()
    page.click("#lang")  # the note follows the language
    assert "max-tokens" in bubble.locator(".json-note").inner_text()
    page.close()


def test_a_schema_the_server_refuses_shows_its_400_message(server, browser):
    page = open_page(browser, server.url, "en")
    bodies = sent_bodies(page)
    switch_on(page)
    bad = {"type": "array", "uniqueItems": True}
    page.fill("#json-schema", json.dumps(bad))
    ask(page, "Hello")
    page.wait_for_selector('#state[data-state="error"]', timeout=60000)
    shown = page.inner_text("#messages .msg.assistant.error .error-text")
    # the same request straight to the server: its message, word for word
    body = {k: v for k, v in bodies[0].items() if k not in ("stream", "stream_options")}
    r = requests.post(server.url + CHAT, json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format.json_schema.schema"
    assert shown == r.json()["error"]["message"]
    page.close()


def test_a_schema_that_is_not_json_is_caught_before_sending(server, browser):
    page = open_page(browser, server.url, "zh")
    bodies = sent_bodies(page)
    switch_on(page)
    page.fill("#json-schema", "{type: object")
    ask(page, "Hello")
    page.wait_for_selector("#json-error:not([hidden])")
    assert "不是有效的 JSON" in page.inner_text("#json-error")
    assert page.get_attribute("#json-schema", "aria-invalid") == "true"
    assert page.locator("#messages .msg").count() == 0 and not bodies
    page.fill("#json-schema", "")  # typing again clears the error
    assert page.is_hidden("#json-error")
    page.close()


def test_the_example_schemas_compile_on_the_server(server, browser):
    page = open_page(browser, server.url, "en")
    for name, ex in examples(page).items():
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                "response_format": {"type": "json_schema", "json_schema": ex}}
        r = requests.post(server.url + CHAT, json=body, timeout=120)
        assert r.status_code == 200, (name, r.text)
    page.close()


def tool_call_stream() -> str:
    """A streamed answer with two tool calls, their arguments cut into fragments (OpenAI's shape)."""

    def chunk(delta, finish=None):
        return {"id": "chatcmpl-tools", "object": "chat.completion.chunk", "created": 0, "model": "demo",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    def call(index, args, id=None, name=None):
        c = {"index": index, "function": {"arguments": args}}
        if id:
            c.update(id=id, type="function")
            c["function"]["name"] = name
        return chunk({"tool_calls": [c]})

    events = [chunk({"role": "assistant", "content": None}),
              call(0, "", "call_a", "count_shapes"), call(0, '{"col'), call(0, 'or": "red", '),
              call(1, '{"query"', "call_b", "lookup"), call(0, '"min": 2}'), call(1, ': "circle"}'),
              chunk({}, "tool_calls")]
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def test_tool_calls_are_shown_as_call_blocks(server, browser):
    page = open_page(browser, server.url, "en")
    page.route("**" + CHAT, lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        body=tool_call_stream()))
    ask(page, "How many red shapes?")
    page.wait_for_selector('#state[data-state="done"]', timeout=60000)
    bubble = page.locator("#messages .msg.assistant").last
    blocks = bubble.locator(".tool-call")
    assert blocks.count() == 2
    assert blocks.nth(0).locator(".tool-call-name").inner_text() == "count_shapes"
    assert json.loads(blocks.nth(0).locator(".tool-call-args").inner_text()) == {"color": "red", "min": 2}
    assert blocks.nth(0).locator(".tool-call-args").inner_text().startswith("{\n  ")
    assert blocks.nth(1).get_attribute("data-id") == "call_b"
    assert json.loads(blocks.nth(1).locator(".tool-call-args").inner_text()) == {"query": "circle"}
    assert bubble.locator(".content").inner_text() == ""  # no call shown as text
    assert "Tool call" in blocks.nth(0).inner_text()
    page.click("#lang")
    assert "工具调用" in blocks.nth(0).inner_text()
    page.close()
