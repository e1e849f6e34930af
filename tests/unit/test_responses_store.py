"""The Responses API's pieces without a model: the store of responses (bounded by count, bytes and
age, per tenant; chains walked back and refused when a link is gone) and the request written as
the chat route's body (items merged into messages, errors renamed into the request's words)."""

from __future__ import annotations

import pytest

from vlservice.config import Settings
from vlservice.http.response_store import ChainBroken, ResponseStore, Stored
from vlservice.protocol.responses import chat_body, items_of, responses_model


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def entry(rid, previous=None, text="x"):
    return Stored(rid, previous, [{"type": "message", "role": "user", "content": text}], {"id": rid})


def test_count_bound_evicts_the_least_recently_used_per_tenant():
    store = ResponseStore(entries=2, max_bytes=1 << 20, ttl_s=0)
    for rid in ("a", "b"):
        assert store.put("t1", entry(rid))
    assert store.get("t1", "a") is not None  # a is now the most recent
    store.put("t1", entry("c"))
    assert store.get("t1", "b") is None and store.get("t1", "a") and store.get("t1", "c")
    store.put("t2", entry("d"))  # another tenant's entries do not push t1's out
    assert store.get("t1", "a") and store.get("t1", "c")
    assert store.get("t2", "a") is None  # nor can it read them


def test_byte_bound_and_an_entry_over_it_alone():
    one = entry("a", text="y" * 100).size
    store = ResponseStore(entries=100, max_bytes=2 * one + 10, ttl_s=0)
    for rid in ("a", "b", "c"):
        store.put("t", entry(rid, text="y" * 100))
    assert store.get("t", "a") is None and store.get("t", "b") and store.get("t", "c")
    assert store.stats()["bytes"] <= 2 * one + 10
    assert not store.put("t", entry("big", text="y" * (3 * one)))
    assert store.get("t", "big") is None and store.get("t", "c")


def test_age_bound_from_creation():
    clock = Clock()
    store = ResponseStore(entries=10, max_bytes=1 << 20, ttl_s=60, clock=clock)
    store.put("t", entry("a"))
    clock.now += 30
    store.put("t", entry("b"))
    clock.now += 31
    assert store.get("t", "a") is None and store.get("t", "b") is not None
    clock.now += 30
    assert store.get("t", "b") is None
    assert store.stats() == {"entries": 0, "bytes": 0}


def test_a_chain_is_walked_back_and_refused_when_a_link_is_gone():
    store = ResponseStore(entries=10, max_bytes=1 << 20, ttl_s=0)
    store.put("t", entry("a"))
    store.put("t", entry("b", "a"))
    store.put("t", entry("c", "b"))
    assert [e.id for e in store.chain("t", "c")] == ["a", "b", "c"]
    assert store.delete("t", "b") and not store.delete("t", "b")
    with pytest.raises(ChainBroken) as gone:
        store.chain("t", "c")
    assert gone.value.args[0] == "b"
    with pytest.raises(ChainBroken):
        store.chain("other-tenant", "c")


def test_items_become_the_chat_routes_messages():
    model = responses_model(Settings())
    r = model.model_validate({"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"},
                                     {"type": "input_text", "text": "What is it?"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "A cat.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "ok"}]}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"}, "max_output_tokens": 9, "seed": 3.0})
    earlier = [{"type": "message", "role": "user", "content": "Hi."}]
    body, origins = chat_body(r, earlier, items_of(r))
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA",
                                                                         "detail": "low"}},
                                     {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": "A cat.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    assert body["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["max_tokens"] == 9 and body["seed"] == 3
    assert origins.rename("messages[2].content[0].image_url") == "input[0].content[0].image_url"
    assert origins.rename("messages[1].content") == "previous_response_id"
    assert origins.rename("messages[0].content") == "instructions"
    assert origins.rename("response_format.json_schema.schema") == "text.format.schema"
    assert origins.rename("tools[0].function.parameters") == "tools[0].parameters"
    assert origins.rename("max_tokens") == "max_output_tokens"
