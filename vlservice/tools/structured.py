"""`python -m vlservice bench --structured N`: N image requests through the real server with the
official `openai` client's structured-output helper, and N forced tool calls.

The server is started as users start it (Gunicorn, the bundled demo model unless `VL_MODEL` says
otherwise). Each request sends a picture the demo model was never trained on (drawn out of its
training style, from a seed no training or tuning used) with a schema it never saw:

- `client.chat.completions.parse(..., response_format=Scene)`: the answer must come back as a
  valid `Scene` (`message.parsed`), unless `max_tokens` cut it (`finish_reason` "length",
  counted apart);
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


def tool() -> dict:
    """`record_scene` as the openai client writes a pydantic model's function (a strict schema)."""
    import openai

    return dict(openai.pydantic_function_tool(Scene, name="record_scene", description="Record what the picture shows"))


def images(n: int) -> list[bytes]:
    import cv2

    from ..demo.render import OUT_OF_STYLE, iter_styled_samples

    out = []
    for s in iter_styled_samples(SEED, n, OUT_OF_STYLE, pool="held_out"):
        ok, buf = cv2.imencode(".png", s.image[:, :, ::-1].copy())
        out.append(buf.tobytes())
    return out


def _message(png: bytes, text: str) -> list:
    import base64

    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def parse_one(client, png: bytes, max_tokens: int) -> dict:
    t = time.perf_counter()
    a = client.chat.completions.parse(model="demo", messages=_message(png, "Describe this picture."),
                                      response_format=Scene, max_tokens=max_tokens, temperature=0)
    c = a.choices[0]
    return {"finish": c.finish_reason, "valid": isinstance(c.message.parsed, Scene),
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
    return {"requests": len(rows), "finished": len(done), "cut_by_max_tokens": sum(r["finish"] == "length" for r in rows),
            "valid": sum(r["valid"] for r in rows), "valid_of_finished": sum(r["valid"] for r in done),
            "median_tokens": statistics.median(r["tokens"] for r in rows),
            "median_s": round(statistics.median(r["s"] for r in rows), 2)}


def markdown(report: dict) -> str:
    from .harness import md_table

    lines = ["# Structured output and forced tool calls through the openai client", "",
             f"CPU: {report['cpu'].get('model', '?')} ({', '.join(report['cpu'].get('flags', []))}); "
             f"{report['date']}; `{report['command']}`; model: {report['model']}; seed {SEED}", ""]
    keys = ("requests", "finished", "valid", "cut_by_max_tokens", "median_tokens", "median_s")
    lines += md_table(["helper", "requests", "finished", "valid", "cut by max_tokens", "median tokens", "median s"],
                      [[name, *(s[k] for k in keys)] for name, s in report["results"].items()])
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
        pngs = images(args.n)
        with cf.ThreadPoolExecutor(args.clients) as pool:
            parsed = list(pool.map(lambda p: parse_one(client, p, args.max_tokens), pngs))
            called = list(pool.map(lambda p: call_one(client, p, args.max_tokens), pngs))
        model = client.models.list().data[0].id
    finally:
        server.stop()
    report = {"cpu": cpu_info(settings.num_threads), **run_record(), "model": model, "seed": SEED,
              "max_tokens": args.max_tokens, "results": {"chat.completions.parse": summary(parsed, "stop"),
                                                         "tools, required, one call": summary(called, "tool_calls")}}
    (args.out / "structured.json").write_text(json.dumps(report, indent=2))
    (args.out / "structured.md").write_text(markdown(report))
    print((args.out / "structured.md").read_text())
    return 0 if all(s["valid_of_finished"] == s["finished"] for s in report["results"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
