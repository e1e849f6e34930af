"""The page's session id: one per conversation, sent with every request of it, so a load balancer
in front of several replicas keeps the conversation (and its KV cache) on one replica; the
server echoes it and names itself (docs/operations.md, Scaling out)."""

from __future__ import annotations

import re

import pytest

from test_page import CHAT, open_page

pytestmark = [pytest.mark.browser, pytest.mark.server]


def ask(page, question: str, answers: int) -> None:
    page.fill("#question", question)
    page.click("#send")
    page.wait_for_function(f"document.querySelectorAll('#messages .msg.assistant').length == {answers}")
    page.wait_for_selector('#state[data-state="done"]', timeout=120000)


def test_each_conversation_sends_its_own_session_id(server, browser):
    page = open_page(browser, server.url, "en")
    sent, echoed = [], []
    page.on("request", lambda r: sent.append(r.headers.get("x-session-id")) if r.url.endswith(CHAT) else None)
    page.on("response", lambda r: echoed.append((r.headers.get("x-session-id"), r.headers.get("x-served-by")))
            if r.url.endswith(CHAT) else None)
    ask(page, "Hello", 1)
    ask(page, "And again?", 2)  # a follow-up: the same session
    page.click("#new-chat")
    ask(page, "Hello", 1)  # a new conversation: a new session
    assert len(sent) == 3 and sent[0] == sent[1] != sent[2]
    assert all(re.fullmatch(r"page-[0-9a-f]{24}", s) for s in sent)
    assert [e[0] for e in echoed] == sent
    assert all(e[1] for e in echoed)  # the replica that answered (the host name here)
    page.close()
