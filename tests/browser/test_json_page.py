"""The page's JSON switch, in Chromium against the real server and the bundled demo model: the
shape-list example sent with an image comes back as an object that validates against the schema and
is shown parsed; an answer cut by max tokens is shown as text with a note; a schema the server
cannot use shows the server's 400 message; a schema that is not JSON is caught before sending; the
example schemas compile on the server. And the switch's other way to ask, "a function call": the
shape-list example sent with an image as one function's `parameters` with a `tool_choice` naming it
comes back, streamed, as a call (finish_reason "tool_calls") shown as a call block whose arguments
validate against the schema."""

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
        # and as the parameters of a forced call
        body = {"messages": body["messages"], "max_tokens": 1,
                "tools": [{"type": "function", "function": {"name": ex["name"], "parameters": ex["schema"]}}],
                "tool_choice": {"type": "function", "function": {"name": ex["name"]}}}
        r = requests.post(server.url + CHAT, json=body, timeout=120)
        assert r.status_code == 200, (name, r.text)
    page.close()


# A copy of each chat answer's stream as the page reads it (its fetch's body teed; Playwright cannot
# give a streamed response's body), in window.chatStreams as {text, done}.
RECORD_STREAMS = """(() => {
  window.chatStreams = [];
  const fetch0 = window.fetch;
  window.fetch = async (...args) => {
    const resp = await fetch0(...args);
    if (!String(args[0]).endsWith('/v1/chat/completions') || !resp.body) return resp;
    const [page, copy] = resp.body.tee();
    const rec = {text: '', done: false};
    window.chatStreams.push(rec);
    new Response(copy).text().then((t) => { rec.text = t; rec.done = true; });
    return new Response(page, {status: resp.status, statusText: resp.statusText, headers: resp.headers});
  };
})()"""


def sse_data(text: str) -> list[dict]:
    """The data chunks of a chat stream (its stage events and [DONE] left out)."""
    events = [e for e in text.split("\n\n") if not any(line.startswith("event:") for line in e.splitlines())]
    data = [line[6:] for e in events for line in e.splitlines() if line.startswith("data: ")]
    return [json.loads(d) for d in data if d != "[DONE]"]


def test_shape_list_as_a_function_call_is_shown_as_a_call_block(server, browser, tmp_path):
    page = open_page(browser, server.url, "en", viewport={"width": 1280, "height": 900})
    page.add_init_script(RECORD_STREAMS)
    page.reload()
    page.wait_for_selector("#presets button")
    bodies = sent_bodies(page)
    image = tmp_path / "shapes.png"
    image.write_bytes(png_bytes(scene(seed=67)))
    page.set_input_files("#file-input", str(image))
    page.wait_for_selector("#preview:not([hidden])")
    switch_on(page)
    assert page.is_checked("#json-as-json")  # JSON unless asked otherwise
    page.select_option("#json-example", "shapes")
    page.check("#json-as-tool")
    schema = examples(page)["shapes"]["schema"]
    page.fill("#max-tokens", "400")
    ask(page, "List the shapes in this image.")
    page.wait_for_selector('#state[data-state="done"]', timeout=180000)
    body = bodies[0]
    assert "response_format" not in body and body["stream"] is True
    assert body["messages"][-1]["content"][0]["type"] == "image_url"
    assert body["tools"] == [{"type": "function", "function": {
        "name": "shapes", "parameters": schema,
        "description": "Record what the user asks about, as arguments that follow the schema."}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "shapes"}}
    bubble = page.locator("#messages .msg.assistant").last
    assert bubble.get_attribute("data-json") == "call", bubble.inner_text()
    blocks = bubble.locator(".tool-call")
    assert blocks.count() == 1
    block = blocks.first
    assert block.get_attribute("data-parsed") == "true"
    assert block.locator(".tool-call-name").inner_text() == "shapes"
    shown = block.locator(".tool-call-args").inner_text()
    assert shown.startswith("{\n  ")  # pretty-printed
    args = json.loads(shown)
    jsonschema.validate(args, schema)
    # the stream's finish is a call, shown as one: no text, no parsed JSON, no note
    assert bubble.locator(".content").inner_text() == ""
    assert bubble.locator(".json-view").count() == 0 and bubble.locator(".notes").is_hidden()
    page.wait_for_function("window.chatStreams.length === 1 && window.chatStreams[0].done")
    chunks = sse_data(page.evaluate("window.chatStreams[0].text"))
    finishes = [c["finish_reason"] for d in chunks for c in d.get("choices", []) if c.get("finish_reason")]
    assert finishes == ["tool_calls"]
    calls = [t for d in chunks for c in d.get("choices", []) for t in (c["delta"].get("tool_calls") or [])]
    assert [(t["function"]["name"], t["id"]) for t in calls] == [("shapes", block.get_attribute("data-id"))]
    assert json.loads(calls[0]["function"]["arguments"]) == args
    assert "Tool call" in block.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page-json-call.png"), full_page=True)
    page.click("#lang")  # the labels follow the language
    assert "工具调用" in block.inner_text()
    assert "函数调用" in page.inner_text(".json-as")
    page.close()


def test_an_own_schema_asked_as_a_call_is_the_record_function(server, browser):
    page = open_page(browser, server.url, "zh")
    bodies = sent_bodies(page)
    switch_on(page)
    page.check("#json-as-tool")
    schema = {"type": "object", "properties": {"color": {"type": "string", "maxLength": 12}},
              "required": ["color"], "additionalProperties": False}
    page.fill("#json-schema", json.dumps(schema))
    page.fill("#max-tokens", "100")
    ask(page, "红色的圆是什么颜色？")
    page.wait_for_selector('#state[data-state="done"]', timeout=120000)
    fn = bodies[0]["tools"][0]["function"]
    assert (fn["name"], fn["parameters"]) == ("record", schema)
    assert fn["description"] == "按 Schema 以参数形式记录用户所问的内容。"  # in the page's language
    assert bodies[0]["tool_choice"] == {"type": "function", "function": {"name": "record"}}
    block = page.locator("#messages .msg.assistant").last.locator(".tool-call")
    assert block.locator(".tool-call-name").inner_text() == "record"
    jsonschema.validate(json.loads(block.locator(".tool-call-args").inner_text()), schema)
    page.close()
