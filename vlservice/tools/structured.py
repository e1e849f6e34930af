"""`python -m vlservice bench --structured N`: N image requests through the real server with the
official `openai` client's structured-output helper, and N forced tool calls.

The server is started as users start it (Gunicorn, the bundled demo model unless `VL_MODEL` says
otherwise). Each request sends a picture the demo model was never trained on (drawn out of its
training style, from a seed no training or tuning used) with a schema it never saw:

- `client.chat.completions.parse(..., response_format=Scene)`: the answer must come back as a
  valid `Scene` (`message.parsed`), unless `max_tokens` cut it (`finish_reason` "length",
  counted apart);
- `client.chat.completions.parse(..., response_format=Plain)` on the pictures of shapes, asking
  "What shape is this, what colour, and how many shapes are there?": a schema as a client writes it
  (free strings, a plain integer), so the grammar guarantees only the JSON's shape, and the answer
  is scored for being right against the drawn picture (`correct`: the count, and a shape and colour
  that some drawn shape has), apart from being valid;
- `tools=[record_scene], tool_choice="required", parallel_tool_calls=False`: the call's arguments
  must validate against the function's schema. (With parallel calls allowed, the demo model, which
  never saw a tool call, follows one call with another until `max_tokens`: it has not learnt to
  stop there; each call is still valid.)

Written: structured.json / structured.md in --out, with the CPU, the date and the command.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

SEED = 20261207  # the report's seed: images no training run or setting was chosen on


class Thing(BaseModel):
    kind: Literal["circle", "square", "triangle", "star", "text", "other"]
    color: Literal["red", "green", "blue", "yellow", "orange", "purple", "black", "white", "other"]
    where: Literal["left", "right", "top", "bottom", "middle"]


class Scene(BaseModel):
    """A schema the demo model never saw: enums, a bounded string, a bounded array of objects, a number."""

    title: str = Field(max_length=40)
    things: list[Thing] = Field(min_length=1, max_length=4)
    busy: bool
    count: int = Field(ge=0, le=20)


class Plain(BaseModel):
    """What a client writes without thinking of the grammar: free strings and a plain integer."""

    shape: str
    color: str
    count: int


PLAIN_QUESTION = "What shape is this, what colour, and how many shapes are there? Answer in JSON."


def tool() -> dict:
    """`record_scene` as the openai client writes a pydantic model's function (a strict schema)."""
    import openai

    return dict(openai.pydantic_function_tool(Scene, name="record_scene", description="Record what the picture shows"))


def images(n: int, shapes_only: bool = False) -> list[tuple[bytes, tuple]]:
    """`n` pictures from the report's seed, each with its drawn objects ((shape, colour, ...) per
    shape; () for a text card); `shapes_only`: pictures of shapes only."""
    import cv2

    from ..demo.render import OUT_OF_STYLE, iter_styled_samples

    out: list[tuple[bytes, tuple]] = []
    seed = SEED if not shapes_only else SEED + 1
    while len(out) < n:
        for s in iter_styled_samples(seed, n, OUT_OF_STYLE, pool="held_out"):
            if len(out) < n and (s.objects or not shapes_only):
                ok, buf = cv2.imencode(".png", s.image[:, :, ::-1].copy())
                out.append((buf.tobytes(), s.objects))
        seed += 1000
    return out


def right(answer: Plain, objects: tuple) -> bool:
    """The count, and a shape and colour that one of the drawn shapes has (words compared lower-case)."""
    drawn = {(shape, color) for shape, color, *_ in objects}
    said = (answer.shape.strip().lower(), answer.color.strip().lower())
    return answer.count == len(objects) and said in drawn


def _message(png: bytes, text: str) -> list:
    import base64

    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def parse_one(client, png: bytes, max_tokens: int) -> dict:
    import openai

    t = time.perf_counter()
    try:
        a = client.chat.completions.parse(model="demo", messages=_message(png, "Describe this picture."),
                                          response_format=Scene, max_tokens=max_tokens, temperature=0)
    except openai.LengthFinishReasonError as cut:
        return {"finish": "length", "valid": False,
                "tokens": cut.completion.usage.completion_tokens if cut.completion.usage else max_tokens,
                "s": time.perf_counter() - t}
    c = a.choices[0]
    return {"finish": c.finish_reason, "valid": isinstance(c.message.parsed, Scene),
            "tokens": a.usage.completion_tokens, "s": time.perf_counter() - t}


def plain_one(client, png: bytes, objects: tuple, max_tokens: int) -> dict:
    import openai

    t = time.perf_counter()
    try:
        a = client.chat.completions.parse(model="demo", messages=_message(png, PLAIN_QUESTION), response_format=Plain,
                                          max_tokens=max_tokens, temperature=0)
    except openai.LengthFinishReasonError as cut:  # the helper raises where the answer ran to max_tokens
        return {"finish": "length", "valid": False, "correct": False,
                "tokens": cut.completion.usage.completion_tokens if cut.completion.usage else max_tokens,
                "s": time.perf_counter() - t}
    c = a.choices[0]
    parsed = c.message.parsed if isinstance(c.message.parsed, Plain) else None
    return {"finish": c.finish_reason, "valid": parsed is not None, "correct": parsed is not None and right(parsed, objects),
            "tokens": a.usage.completion_tokens, "s": time.perf_counter() - t}


def call_one(client, png: bytes, max_tokens: int) -> dict:
    t = time.perf_counter()
    a = client.chat.completions.create(model="demo", messages=_message(png, "Record what you see."), tools=[tool()],
                                       tool_choice="required", parallel_tool_calls=False, max_tokens=max_tokens,
                                       temperature=0)
    c = a.choices[0]
    valid = bool(c.message.tool_calls)
    for call in c.message.tool_calls or []:
        try:
            valid = valid and call.function.name == "record_scene" and bool(
                Scene.model_validate_json(call.function.arguments))
        except ValidationError:
            valid = False
    return {"finish": c.finish_reason, "valid": valid, "calls": len(c.message.tool_calls or []),
            "tokens": a.usage.completion_tokens, "s": time.perf_counter() - t}


def summary(rows: list, ok_finish: str) -> dict:
    done = [r for r in rows if r["finish"] == ok_finish]
    out = {"requests": len(rows), "finished": len(done), "cut_by_max_tokens": sum(r["finish"] == "length" for r in rows),
           "valid": sum(r["valid"] for r in rows), "valid_of_finished": sum(r["valid"] for r in done),
           "median_tokens": statistics.median(r["tokens"] for r in rows),
           "median_s": round(statistics.median(r["s"] for r in rows), 2)}
    if "correct" in rows[0]:
        out["correct"] = sum(r["correct"] for r in rows)
    return out


def markdown(report: dict) -> str:
    from .harness import md_table

    lines = ["# Structured output and forced tool calls through the openai client", "",
             f"CPU: {report['cpu'].get('model', '?')} ({', '.join(report['cpu'].get('flags', []))}); "
             f"{report['date']}; `{report['command']}`; model: {report['model']}; seed {SEED}", ""]
    keys = ("requests", "finished", "valid", "correct", "cut_by_max_tokens", "median_tokens", "median_s")
    lines += md_table(["helper", "requests", "finished", "valid", "correct", "cut by max_tokens", "median tokens",
                       "median s"], [[name, *(s.get(k, "-") for k in keys)] for name, s in report["results"].items()])
    lines += ["", "*valid*: the answer parses under the schema (with the bounded `Scene` the grammar alone "
              "guarantees it); *correct*: the plain schema's fields are right about the picture."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from openai import OpenAI

    from ..config import Settings
    from ..obs.records import cpu_info, run_record
    from .harness import Server

    ap = argparse.ArgumentParser(prog="python -m vlservice bench --structured", description=__doc__.split("\n\n")[0])
    ap.add_argument("n", type=int, nargs="?", default=200)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = Settings.from_env()
    server = Server({"VL_RESULT_CACHE_ENTRIES": "0"}, args.out / "structured-server.log")
    try:
        server.wait_ready()
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        pngs = [png for png, _ in images(args.n)]
        shapes = images(args.n, shapes_only=True)
        with cf.ThreadPoolExecutor(args.clients) as pool:
            parsed = list(pool.map(lambda p: parse_one(client, p, args.max_tokens), pngs))
            plain = list(pool.map(lambda s: plain_one(client, *s, args.max_tokens), shapes))
            called = list(pool.map(lambda p: call_one(client, p, args.max_tokens), pngs))
        model = client.models.list().data[0].id
    finally:
        server.stop()
    report = {"cpu": cpu_info(settings.num_threads), **run_record(), "model": model, "seed": SEED,
              "max_tokens": args.max_tokens, "results": {"chat.completions.parse": summary(parsed, "stop"),
                                                         "parse, plain schema (shape, colour, count)": summary(plain, "stop"),
                                                         "tools, required, one call": summary(called, "tool_calls")}}
    (args.out / "structured.json").write_text(json.dumps(report, indent=2))
    (args.out / "structured.md").write_text(markdown(report))
    print((args.out / "structured.md").read_text())
    return 0 if all(s["valid_of_finished"] == s["finished"] for s in report["results"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
