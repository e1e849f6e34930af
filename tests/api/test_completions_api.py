"""OpenAI's legacy Completions and the tokenizer routes through the real server (Gunicorn
subprocess, the bundled demo model): `client.completions.create` streamed and not (the same text
for a greedy request), the raw prompt fed without the chat template (its usage counts exactly the
prompt's tokens as /tokenize gives them), markers in the text kept as text, legacy `logprobs`,
several choices (`n`), the refusals (echo, suffix, best_of, n over the batch, several prompts, token
arrays); /tokenize and /detokenize in vLLM's and llama.cpp's shapes, with the round trip and out-of-range ids."""

from __future__ import annotations

import base64

import pytest
import requests

from conftest import image_message, png_bytes, scene

pytestmark = pytest.mark.server

PROMPT = "<|im_start|>user\nThe cat sat on the"


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=180)


def tokenize(server, body: dict, path: str = "/tokenize") -> dict:
    r = requests.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_streamed_equals_non_streamed_and_counts_the_raw_prompt(server):
    c = client(server)
    a = c.completions.create(model="demo", prompt=PROMPT, max_tokens=12, temperature=0,
                             extra_body={"result_cache": False})
    assert a.object == "text_completion" and a.id.startswith("cmpl-") and len(a.choices) == 1
    assert a.choices[0].finish_reason in ("stop", "length") and a.choices[0].index == 0
    # no chat template: the prompt is exactly the text's tokens, its marker spelt as characters
    ids = tokenize(server, {"prompt": PROMPT})["tokens"]
    assert a.usage.prompt_tokens == len(ids)
    assert a.usage.completion_tokens <= 12 and a.usage.total_tokens == len(ids) + a.usage.completion_tokens
    chunks = list(c.completions.create(model="demo", prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"result_cache": False}))
    assert all(ch.object == "text_completion" and ch.id == chunks[0].id for ch in chunks)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == a.choices[0].text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == a.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == a.usage.completion_tokens
    # a list of one string is that string
    b = c.completions.create(model="demo", prompt=[PROMPT], max_tokens=12, temperature=0)
    assert b.choices[0].text == a.choices[0].text


def test_a_marker_in_the_prompt_is_text_not_a_control_token(server):
    special = tokenize(server, {"messages": [{"role": "user", "content": "x"}]})["tokens"][0]  # <|im_start|>
    for body in ({"prompt": PROMPT}, {"content": PROMPT}):
        ids = tokenize(server, body)["tokens"]
        assert special not in ids and len(ids) > 5
    # in a chat, the same characters typed by the client are text too
    chat = tokenize(server, {"messages": [{"role": "user", "content": PROMPT}]})["tokens"]
    assert chat.count(special) == 2  # the template's user and assistant turns, not the typed one


def test_legacy_logprobs(server):
    a = client(server).completions.create(model="demo", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2,
                                          extra_body={"min_tokens": 6})
    lp = a.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert all(x <= 0 for x in lp.token_logprobs) and all(1 <= len(t) <= 2 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == a.choices[0].text


@pytest.mark.parametrize("extra, param", [
    ({"echo": True}, "echo"), ({"suffix": "end"}, "suffix"), ({"best_of": 2}, "best_of"), ({"n": 5}, "n"),
    ({"logit_bias": {"50": 5}}, "logit_bias"), ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": [[1, 2]]}, "prompt"), ({"prompt": ""}, "prompt"), ({"logprobs": 6}, "logprobs"),
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"),
])
def test_refused_with_400_naming_the_field(server, extra, param):
    r = requests.post(server.url + "/v1/completions", json={"model": "demo", "prompt": "Hi", **extra}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_several_choices_each_as_its_seed_alone_streamed_as_not(server):
    """`n` = 3 with a seed: choice i is the request alone with seed + i; the streamed choices (chunks
    tagged by `index`, each its own finish) equal the non-streamed ones; usage counts the prompt once."""
    c = client(server)
    ask = dict(model="demo", prompt=PROMPT, max_tokens=8, temperature=0.9, seed=11,
               extra_body={"result_cache": False, "min_tokens": 8})
    many = c.completions.create(n=3, **ask)
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    alone = c.completions.create(**{**ask, "seed": 13})
    assert many.choices[2].text == alone.choices[0].text
    assert many.usage.prompt_tokens == alone.usage.prompt_tokens
    assert many.usage.completion_tokens == 3 * alone.usage.completion_tokens == 24
    texts, finishes = ["", "", ""], [None, None, None]
    for chunk in c.completions.create(n=3, stream=True, **ask):
        for ch in chunk.choices:
            texts[ch.index] += ch.text
            finishes[ch.index] = ch.finish_reason or finishes[ch.index]
    assert texts == [ch.text for ch in many.choices]
    assert finishes == [ch.finish_reason for ch in many.choices] == ["length"] * 3


def test_too_many_choices_are_refused_through_the_client(server):
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        client(server).completions.create(model="demo", prompt="Hi", n=5, max_tokens=2)
    assert "`n` must be" in refused.value.message and refused.value.body["param"] == "n"


@pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize"])
@pytest.mark.parametrize("text", ["Hello, world!", PROMPT + "<|image_pad|><tool_call>", "中文 ünïcödé 🙂 \n\t x"])
def test_tokenize_round_trip(server, path, text):
    vllm = tokenize(server, {"model": "demo", "prompt": text, "return_token_strs": True}, path)
    assert vllm["count"] == len(vllm["tokens"]) == len(vllm["token_strs"]) > 0
    assert vllm["max_model_len"] > vllm["count"]
    llama = tokenize(server, {"content": text}, path)
    assert llama == {"tokens": vllm["tokens"]}
    back = tokenize(server, {"tokens": vllm["tokens"]}, path.replace("tokenize", "detokenize"))
    assert back == {"prompt": text, "content": text}
    pieces = tokenize(server, {"content": text, "with_pieces": True}, path)["tokens"]
    assert [p["id"] for p in pieces] == vllm["tokens"]


def test_tokenize_messages_counts_the_image_and_the_generation_prompt(server):
    msgs = image_message(png_bytes(scene(seed=901)), "Describe this image.")
    with_it = tokenize(server, {"messages": msgs})
    without = tokenize(server, {"messages": msgs, "add_generation_prompt": False})
    assert with_it["tokens"][:without["count"]] == without["tokens"] and with_it["count"] > without["count"]
    a = client(server).chat.completions.create(model="demo", messages=msgs, max_tokens=1)
    text_only = tokenize(server, {"messages": [{"role": "user", "content": "Describe this image."}]})["count"]
    assert a.usage.prompt_tokens == with_it["count"] > text_only + 4  # the image's tokens are counted
    data = base64.b64encode(png_bytes(scene(seed=901))).decode()
    counted = requests.post(server.url + "/v1/messages/count_tokens", json={"model": "demo", "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                   "data": data}},
                                     {"type": "text", "text": "Describe this image."}]}]}, timeout=60)
    assert counted.json() == {"input_tokens": with_it["count"]}


@pytest.mark.parametrize("path, body, param", [
    ("/detokenize", {"tokens": [1, 10**9]}, "tokens[1]"),
    ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/v1/tokenize", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64,bm90"}}]}]}, "messages[0].content[0].image_url"),
])
def test_tokenizer_routes_refuse_with_400(server, path, body, param):
    r = requests.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
