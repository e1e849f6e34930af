"""The page renders whatever the model or the server says as text, never as HTML.

The real page from the real server in Chromium, with the chat endpoint answered by the test
(Playwright `page.route`): answers, stream errors and HTTP errors carrying markup, some of it split
across chunks as a model's tokens would split it. Nothing may run and no element may be made from
them; the markup must be visible as the characters it is. The question the user typed travels the
same way and is held to the same rule."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.server]

CHAT = "**/v1/chat/completions"

# Each piece would do something if it were parsed as HTML: make an element, or set window.pwned.
ANSWER = ['<img src=x onerror="window.pwned=1">', "<b>bo", "ld</b> & <scr", "ipt>window.pwned=2</script>",
          "<svg onload=window.pwned=3></svg>"]
QUESTION = "<img src=y onerror=window.pwned=4><i>mine</i>"
ERROR = "<img src=z onerror=window.pwned=5><u>bad</u>"
MARKUP = "#messages img, #messages b, #messages i, #messages u, #messages script, #messages svg"


def sse(*objs) -> str:
    return "".join(f"data: {json.dumps(o)}\n\n" for o in objs) + "data: [DONE]\n\n"


def chunk(content=None, finish=None) -> dict:
    delta = {} if content is None else {"content": content}
    return {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": "demo",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def error_json(message) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "x"}}


# (name, status, content type, body, the page's final state, where the markup shows, the text it shows)
REPLIES = [
    ("streamed answer", 200, "text/event-stream",
     sse(chunk(""), *map(chunk, ANSWER), chunk(finish="stop")), "done", ".msg.assistant .content", "".join(ANSWER)),
    ("stream error", 200, "text/event-stream", sse(chunk(ANSWER[0]), error_json(ERROR)), "error",
     ".msg.assistant .error-text", ERROR),
    ("whole JSON answer", 200, "application/json",
     json.dumps({"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "demo",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(ANSWER)},
                              "finish_reason": "stop"}]}), "done", ".msg.assistant .content", "".join(ANSWER)),
    ("HTTP error", 400, "application/json", json.dumps(error_json(ERROR)), "error", ".msg.assistant .error-text",
     ERROR),
]


@pytest.mark.parametrize("name,status,ctype,body,state,where,text", REPLIES, ids=[r[0] for r in REPLIES])
def test_markup_from_the_server_is_shown_as_text(server, browser, name, status, ctype, body, state, where, text):
    page = browser.new_page()
    answered = []

    def reply(route):
        answered.append(route.request.post_data)
        route.fulfill(status=status, headers={"Content-Type": ctype, "Cache-Control": "no-cache"}, body=body)

    page.route(CHAT, reply)
    page.goto(server.url + "/")
    page.wait_for_selector("#presets button")  # the page is configured: it may send
    page.fill("#question", QUESTION)
    page.click("#send")
    page.wait_for_selector(f'#state[data-state="{state}"]', timeout=30000)
    assert len(answered) == 1 and QUESTION in json.loads(answered[0])["messages"][-1]["content"]
    assert page.inner_text(f"#messages {where}") == text  # visible, character for character
    assert page.inner_text("#messages .msg.user .content") == QUESTION
    assert page.eval_on_selector_all(MARKUP, "els => els.length") == 0  # no element was made of it
    assert page.evaluate("window.pwned") is None  # and nothing in it ran
    page.close()
