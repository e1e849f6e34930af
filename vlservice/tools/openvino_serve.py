"""A minimal OpenAI chat server over OpenVINO GenAI, run by the OpenVINO tool environment's python
(see openvino_peer.py; it imports only the standard library, numpy, pillow and openvino).

POST /v1/chat/completions: one user message with one image (a data: URI `image_url` part) and text;
`stream: true` answers with SSE chunks `data: {"choices": [{"delta": {"content": ...}}]}` and
`data: [DONE]` (the last chunk carries `usage` and llama-server-style `timings`: `prompt_ms`, the
time from the request to its first token, image included); `max_tokens`, `min_tokens` ->
`min_new_tokens`, `ignore_eos`; `temperature` 0 (or none) is greedy.
GET /health: 200 with JSON once the pipeline is loaded: `load_s`, `pipeline`, and after the first
request `first_request_s` / `first_token_s` (OpenVINO compiles then: reported apart).

`--pipeline cb` (default): `ContinuousBatchingPipeline` with `max_num_seqs` = `--parallel`; one
thread adds requests and runs `step()` for all of them (continuous batching, as OpenVINO Model Server
serves a VLM). `--pipeline vlm`: `VLMPipeline`, one request at a time under a lock.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import logging
import queue
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import openvino as ov
import openvino_genai as ov_genai
from PIL import Image

log = logging.getLogger("openvino_serve")
STATE: dict = {}


def image_tensor(url: str):
    data = base64.b64decode(url.split(",", 1)[1])
    return ov.Tensor(np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.uint8))


def parse(body: dict):
    """(prompt, images, GenerationConfig) of an OpenAI chat request."""
    texts, images = [], []
    for message in body.get("messages", []):
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for part in parts:
            if part.get("type") == "text":
                texts.append(part["text"])
            elif part.get("type") == "image_url":
                images.append(image_tensor(part["image_url"]["url"]))
    cfg = ov_genai.GenerationConfig()
    cfg.max_new_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 256)
    if body.get("min_tokens"):
        cfg.min_new_tokens = int(body["min_tokens"])
    cfg.ignore_eos = bool(body.get("ignore_eos", False))
    temperature = body.get("temperature")
    if temperature:
        cfg.do_sample = True
        cfg.temperature = float(temperature)
    return "\n".join(texts), images, cfg


class TextDelta:
    """Token ids in, new text out (a piece that ends inside a UTF-8 character waits for the next)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.sent = tokenizer, [], ""

    def add(self, ids) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        new, self.sent = text[len(self.sent):], text
        return new


class Sink:
    """One request's tokens: each is written to the client by the thread that made it (the step loop or
    VLMPipeline's streamer), so its time on the wire is the step's, whatever the other threads do."""

    def __init__(self, t0: float, write=None):
        self.t0, self.first, self.n, self.texts = t0, None, 0, []
        self.write, self.gone, self.error, self.done = write, False, None, threading.Event()

    def token(self, text: str) -> bool:
        """Count and send one token's text; True once the client has gone (generation may stop)."""
        self.n += 1
        if self.first is None:
            self.first = time.perf_counter() - self.t0
        self.texts.append(text)
        if self.write is not None and text and not self.gone:
            try:
                self.write(text)
            except OSError:
                self.gone = True
        return self.gone

    def finish(self, error: Exception | None = None) -> None:
        self.error = error
        self.done.set()


class ContinuousBatching:
    """One thread adds waiting requests and steps the pipeline for all running ones."""

    def __init__(self, model: str, parallel: int, threads: int, cache_gb: int):
        sc = ov_genai.SchedulerConfig()
        sc.max_num_seqs = parallel
        sc.cache_size = cache_gb
        threads_only = {"INFERENCE_NUM_THREADS": threads}  # the vision encoder too (its own properties here)
        self.pipe = ov_genai.ContinuousBatchingPipeline(model, sc, "CPU", properties=threads_only,
                                                        vision_encoder_properties=threads_only)
        self.tokenizer = self.pipe.get_tokenizer()
        self.waiting: queue.Queue = queue.Queue()
        self.next_id = 0
        threading.Thread(target=self.loop, daemon=True).start()

    def loop(self) -> None:
        running: list = []  # (handle, Sink, TextDelta)
        while True:
            new = [self.waiting.get()] if not running else []
            while not self.waiting.empty():
                new.append(self.waiting.get_nowait())
            for prompt, images, cfg, sink in new:
                try:
                    self.next_id += 1
                    running.append((self.pipe.add_request(self.next_id, prompt, images, cfg), sink,
                                    TextDelta(self.tokenizer)))
                except Exception as e:  # noqa: BLE001 - a request it refuses fails alone
                    sink.finish(e)
            if not running:
                continue
            try:
                self.pipe.step()
            except Exception as e:  # noqa: BLE001 - every waiting client hears of it
                for _, sink, _ in running:
                    sink.finish(e)
                running = []
                continue
            still = []
            for handle, sink, delta in running:
                if handle.can_read():
                    for result in handle.read().values():
                        if sink.token(delta.add(list(result.generated_ids))):
                            handle.cancel()
                if handle.get_status() == ov_genai.GenerationStatus.RUNNING:
                    still.append((handle, sink, delta))
                else:
                    sink.finish()
            running = still

    def generate(self, prompt, images, cfg, sink: Sink) -> None:
        self.waiting.put((prompt, images, cfg, sink))


class TokenStreamer(ov_genai.StreamerBase):
    """VLMPipeline's streamer that hands on every token (its own TextStreamer joins a word's pieces)."""

    def __init__(self, sink: Sink, tokenizer):
        super().__init__()
        self.sink, self.delta = sink, TextDelta(tokenizer)

    def write(self, token):
        ids = [int(token)] if isinstance(token, int) else [int(t) for t in token]
        for i in ids:
            if self.sink.token(self.delta.add([i])):
                return ov_genai.StreamingStatus.CANCEL
        return ov_genai.StreamingStatus.RUNNING

    def end(self):
        pass


class OneAtATime:
    """VLMPipeline's `generate` under a lock (it takes one request at a time), streamed token by token."""

    def __init__(self, model: str, parallel: int, threads: int, cache_gb: int):
        self.pipe = ov_genai.VLMPipeline(model, "CPU", INFERENCE_NUM_THREADS=threads)
        self.tokenizer = self.pipe.get_tokenizer()
        self.lock = threading.Lock()

    def generate(self, prompt, images, cfg, sink: Sink) -> None:
        def run():
            try:
                with self.lock:
                    self.pipe.generate(prompt, images=images, generation_config=cfg,
                                       streamer=TokenStreamer(sink, self.tokenizer))
                sink.finish()
            except Exception as e:  # noqa: BLE001
                sink.finish(e)

        threading.Thread(target=run, daemon=True).start()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # the benchmark reads its own timings; keep the log short
        pass

    def send_json(self, code: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {k: v for k, v in STATE.items() if k != "engine"})
        else:
            self.send_json(404, {"error": "not found"})

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            return self.send_json(404, {"error": "not found"})
        t0 = time.perf_counter()
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            prompt, images, cfg = parse(body)
        except Exception as e:  # noqa: BLE001
            return self.send_json(400, {"error": {"message": f"bad request: {e}"}})
        stream = bool(body.get("stream"))
        if stream:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")  # each event reaches the client as it is sent
            self.end_headers()
        sink = Sink(t0, (lambda text: self.event({"object": "chat.completion.chunk",
                                              "choices": [{"index": 0, "delta": {"content": text}}]})) if stream else None)
        STATE["engine"].generate(prompt, images, cfg, sink)
        sink.done.wait()
        if sink.error is not None:
            if not stream:
                return self.send_json(500, {"error": {"message": str(sink.error)}})
            self.event({"error": {"message": str(sink.error)}})
            return self.end_chunks()
        first, n, texts = sink.first, sink.n, sink.texts
        total = time.perf_counter() - t0
        first = first if first is not None else total
        if "first_request_s" not in STATE:
            STATE["first_request_s"], STATE["first_token_s"] = round(total, 3), round(first, 3)
            print(f"first request (OpenVINO compiles then): first token {first:.2f} s, {n} tokens in {total:.2f} s",
                  flush=True)
        if sink.gone:  # the client left; its generation was cancelled
            return None
        timings = {"prompt_ms": round(first * 1000, 1), "predicted_n": n,
                   "predicted_per_second": round((n - 1) / (total - first), 3) if n > 1 and total > first else None}
        usage = {"completion_tokens": n}
        if stream:
            self.event({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {},
                        "finish_reason": "length"}], "usage": usage, "timings": timings})
            self.chunk(b"data: [DONE]\n\n")
            self.end_chunks()
        else:
            self.send_json(200, {"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "length",
                                 "message": {"role": "assistant", "content": "".join(texts)}}],
                                 "usage": usage, "timings": timings})

    def event(self, obj: dict) -> None:
        self.chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pipeline", choices=["cb", "vlm"], default="cb")
    ap.add_argument("--cache-gb", type=int, default=1, help="KV cache of the continuous-batching pipeline")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    engine = (ContinuousBatching if args.pipeline == "cb" else OneAtATime)(args.model, args.parallel, args.threads,
                                                                           args.cache_gb)
    STATE.update(engine=engine, status="ok", pipeline=args.pipeline, parallel=args.parallel, threads=args.threads,
                 openvino_genai=ov_genai.__version__, load_s=round(time.perf_counter() - t0, 3))
    print(f"loaded {args.model} ({args.pipeline}) in {STATE['load_s']:.1f} s; serving on 127.0.0.1:{args.port}",
          flush=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
