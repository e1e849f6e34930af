"""`python -m vlservice soak`: mixed traffic against a server for a fixed time, then a verdict.

    python -m vlservice soak --url http://127.0.0.1:8000 --minutes 30 [--concurrency 3]
                             [--api-key K] [--json report.json]
    python -m vlservice soak --serve --minutes 30 [--model demo] [--server-env VL_NAME=VALUE ...]

C client threads send, until the deadline, a mix of: questions about new images (small PNGs drawn
with OpenCV from varied seeds), repeated images (feature / result cache), follow-up questions (the
history with the previous answer: KV-cache reuse), questions about short MP4 clips (OpenCV's
VideoWriter; new ones and repeats), streamed answers, cancellations (a stream read for a few chunks
and closed: the client going away, or cancelled with POST /v1/chat/completions/<id>/cancel) and bad
inputs (invalid base64, data that is not an image, broken JSON, max_tokens over the cap). Only the
given URL is contacted. `/api/stats` is sampled before, every `--sample-every` seconds during and
after the run (after the queue has drained).

Managed mode (`--serve`): the soak starts a real redis-server and Gunicorn as users start it (one
worker, `VL_REDIS_URL` pointing to that Redis, the model `--model`, default the demo), and injects
two faults, recorded as events with their times: at a quarter of the run Redis is stopped (SIGSTOP)
for `--redis-pause` seconds and resumed (SIGCONT); at 55% the worker gets SIGTERM (a rolling
update): it drains (503 `draining` to new requests, the running ones finish) and Gunicorn's master
starts a new one (503 `not_ready` while it warms up). Around the restart clients open a new
connection per request, and after a 503 they back off half a second.

The report (a Markdown table on stdout, optionally JSON) has requests by kind, answers served,
expected refusals (400 for bad inputs; 429/503 under load, while a worker drains or warms up) apart
from unexpected outcomes (5xx other than those, a 4xx for a valid request, a bad input accepted,
connection errors, streams without `[DONE]` that we did not cancel), p50/p95 latency per kind, each
worker's accounting (accepted / finished from its own counters; a worker started during the run
counts from zero), and memory against the caches' budgets: RSS beside the bytes the server's own
caches account for (the feature cache and the conversation KV cache, `bytes` / `capacity_bytes` in
/api/stats), their fill at the end, and per worker three least-squares slopes in MB/min after the
warm-up (`--warmup`, 60 s from the worker's first sample): RSS, the caches' bytes, and RSS less the
caches, the part no cache explains.

Verdict PASS when there was no unexpected outcome, no lost request (no connection error, no
incomplete stream, and the counters of the worker serving at the end show every accepted request
finished once the queue drained), in managed mode both faults injected, and no leak: the slope of
RSS less the caches' own bytes below `--max-rss-slope` (2 MB/min by default) for every worker
judged (at least 3 samples spanning a minute after its warm-up, otherwise "not judged"). A cache
filling its budget grows RSS, not that difference. Exit code 0 on PASS, 1 on FAIL, 2 on bad usage
or when the server cannot be reached (or, managed, cannot start).

HTTP goes through `requests` (a tool dependency: `pip install -r vlservice/tools/requirements.txt`);
numpy and OpenCV (dependencies of the service) draw the images and clips. `/api/stats` describes one
Gunicorn worker: run the server with one worker for a meaningful memory trend.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import signal as sig
import statistics
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import requests

GOOD_KINDS = ("new_image", "repeat_image", "follow_up", "stream", "clip")
CANCEL_KINDS = ("cancel_close", "cancel_api")
BAD_KINDS = ("bad_base64", "not_image", "bad_json", "over_cap")
KINDS = GOOD_KINDS + CANCEL_KINDS + BAD_KINDS
WEIGHTS = {"new_image": 3, "repeat_image": 2, "follow_up": 2, "stream": 2, "clip": 1, "cancel_close": 1, "cancel_api": 1,
           "bad_base64": 1, "not_image": 1, "bad_json": 1, "over_cap": 1}
LOAD_REFUSALS = (429, 503)  # busy / queue timeout: the server protecting itself, expected under load
QUESTIONS = ("Describe this image.", "What shapes do you see?", "What colours are in the picture?",
             "How many circles are there?", "Is there any text?")
FOLLOW_UPS = ("Tell me more.", "Which one is the largest?", "And the background colour?", "Say it in one word.")
WARMUP_S = 60.0
MB = 1024 * 1024
HEAP_KEYS = ("live_less_caches_mb", "heap_free_mb", "rss_anon_mb")  # memory_row's view of the allocator
# The caches whose bytes the server accounts for itself in /api/stats (their `bytes` and
# `capacity_bytes`), with the setting that bounds each: RSS less these is what a leak would grow.
# The result cache holds answers' text (bounded by entries, a few KB); the disk tier is not RSS.
CACHES = (("cache", "feature cache", "VL_FEATURE_CACHE_MB"), ("kv_cache", "conversation KV cache", "VL_KV_CACHE_MB"))


# --------------------------------------------------------------------------- HTTP

class ConnectionFailed(Exception):
    pass


class Http:
    """A requests Session for one thread (sessions are not shared between threads); a request that
    gets no answer raises ConnectionFailed."""

    def __init__(self, base: str, api_key: str = "", timeout: float = 180.0):
        self.base = base.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def request(self, method: str, path: str, body=None, *, raw: bytes | None = None, stream: bool = False,
                timeout: float | None = None) -> requests.Response:
        data = json.dumps(body).encode() if body is not None else raw
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            return self.session.request(method, self.base + path, data=data, headers=headers, stream=stream,
                                        timeout=(10, timeout or self.timeout))
        except requests.RequestException as exc:
            raise ConnectionFailed(f"{type(exc).__name__}: {exc}") from None

    def get_json(self, path: str, timeout: float = 10.0) -> dict:
        """GET a JSON answer. Tried twice: a kept-alive connection the server closed just as the
        request went out (its keep-alive timeout) fails without the server ever seeing it, and a GET
        is safe to send again."""
        try:
            r = self.request("GET", path, timeout=timeout)
        except ConnectionFailed:
            time.sleep(0.2)
            r = self.request("GET", path, timeout=timeout)
        if r.status_code != 200:
            raise ConnectionFailed(f"GET {path}: HTTP {r.status_code}: {r.content[:200]!r}")
        return json.loads(r.content)

    def reset(self) -> None:
        """Drop the kept-alive connection: the next request opens a new one (around a worker restart,
        a connection the old worker is closing must not carry a request)."""
        headers = dict(self.session.headers)
        self.session.close()
        self.session = requests.Session()
        self.session.headers.update(headers)

    def close(self) -> None:
        self.session.close()


# --------------------------------------------------------------------------- images

def make_png(seed: int, h: int = 96, w: int = 128) -> bytes:
    """A small picture with structure (background, circles, a rectangle, a digit), PNG-encoded."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), rng.integers(120, 240, 3), dtype=np.uint8)
    for _ in range(int(rng.integers(1, 4))):
        color = tuple(int(c) for c in rng.integers(0, 255, 3))
        center = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        cv2.circle(img, center, int(rng.integers(4, 30)), color, -1, cv2.LINE_AA)
    x, y = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
    cv2.rectangle(img, (x, y), (x + 20, y + 14), tuple(int(c) for c in rng.integers(0, 255, 3)), -1)
    cv2.putText(img, str(seed % 10), (w // 2, h // 2), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2)
    ok, buf = cv2.imencode(".png", img)
    if not ok:  # pragma: no cover
        raise RuntimeError("cv2.imencode failed")
    return buf.tobytes()


def make_mp4(seed: int, frames: int = 12, fps: float = 4.0, size: tuple = (64, 48)) -> bytes:
    """A short MP4 (OpenCV's mp4v writer): a disc moving over a coloured background, frame by frame."""
    import os
    import tempfile

    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    w, h = size
    bg = tuple(int(c) for c in rng.integers(60, 240, 3))
    fg = tuple(int(c) for c in rng.integers(0, 255, 3))
    fd, path = tempfile.mkstemp(suffix=".mp4", prefix="soak-clip-")
    os.close(fd)
    try:
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
        if not writer.isOpened():  # pragma: no cover
            raise RuntimeError("this OpenCV cannot write mp4v")
        for i in range(frames):
            img = np.full((h, w, 3), bg, dtype=np.uint8)
            cv2.circle(img, (int(i * w / frames), h // 2), 8, fg, -1, cv2.LINE_AA)
            writer.write(img)
        writer.release()
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        os.unlink(path)


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


def image_message(url: str, text: str) -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url, "detail": "low"}},
                                        {"type": "text", "text": text}]}


# --------------------------------------------------------------------------- bookkeeping

@dataclass
class Outcome:
    kind: str
    result: str  # ok | cancelled | refused | unexpected
    label: str  # "200", "400 invalid_image", "connection_error", "incomplete_stream", ...
    latency_ms: float
    detail: str = ""
    lost: bool = False


@dataclass
class Tally:
    outcomes: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, o: Outcome) -> None:
        with self.lock:
            self.outcomes.append(o)


def percentile(values: list, q: int) -> float | None:
    """The q-th percentile (linear between the closest ranks), to 0.1; None without values."""
    if len(values) < 2:
        return round(values[0], 1) if values else None
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 1)


def slope_per_minute(points: list) -> float | None:
    """Least-squares slope of [(t_seconds, value)], per minute; None with fewer than 2 distinct times."""
    try:
        return statistics.linear_regression([t for t, _ in points], [v for _, v in points]).slope * 60.0
    except statistics.StatisticsError:
        return None


def memory_row(t: float, stats: dict) -> dict | None:
    """One /api/stats sample as the memory verdict reads it: time, worker pid, RSS and the bytes the
    server's own caches account for (MB); None when the sample has no RSS."""
    if not isinstance(stats.get("rss_bytes"), int):
        return None
    cached = sum(int((stats.get(name) or {}).get("bytes") or 0) for name, _, _ in CACHES)
    row = {"t": t, "pid": stats.get("pid"), "rss_mb": stats["rss_bytes"] / MB, "caches_mb": cached / MB,
           "queue_depth": stats.get("queue_depth")}
    heap = stats.get("heap")
    if isinstance(heap, dict) and "rss_anon" in heap:  # where the memory is (glibc's view; diagnostic)
        row.update({"live_less_caches_mb": (heap["in_use"] + heap["mmapped"]) / MB - row["caches_mb"],
                    "heap_free_mb": heap["free"] / MB, "rss_anon_mb": heap["rss_anon"] / MB})
    return row


def memory_verdict(rows: list, threshold: float, warmup_s: float = WARMUP_S) -> dict:
    """The memory trend, judged against the caches' budgets. `rows`: memory_row()s in time order.

    Each worker (pid) is a segment of its own (a rolling restart starts a new process with empty
    caches). In a segment, after `warmup_s` from its first sample, three least-squares slopes in
    MB/min: RSS, the caches' own accounted bytes, and their difference (RSS less the caches: what
    the caches do not explain). A segment is judged with at least 3 samples spanning 60 s after its
    warm-up; the verdict fails when a judged segment's unexplained slope reaches `threshold`. Caches
    filling toward their budgets grow RSS, not the unexplained part."""
    segments: list = []
    for row in rows:
        if not segments or segments[-1]["pid"] != row["pid"]:
            segments.append({"pid": row["pid"], "rows": []})
        segments[-1]["rows"].append(row)
    out, failures = [], []
    for seg in segments:
        rs = seg["rows"]
        start = rs[0]["t"]
        warm = [r for r in rs if r["t"] - start >= warmup_s]
        judged = len(warm) >= 3 and warm[-1]["t"] - warm[0]["t"] >= 60.0
        fit = warm if judged else rs

        def slope(key, fit=fit):
            v = slope_per_minute([(r["t"], r[key]) for r in fit])
            return None if v is None else round(v, 3)

        unexplained = slope_per_minute([(r["t"], r["rss_mb"] - r["caches_mb"]) for r in fit])
        item = {"pid": seg["pid"], "start_s": round(start, 1), "end_s": round(rs[-1]["t"], 1), "samples": len(rs),
                "judged": judged, "fit": "after warm-up" if judged else "all samples (not judged: too short)",
                "rss_slope": slope("rss_mb"), "caches_slope": slope("caches_mb"),
                "unexplained_slope": None if unexplained is None else round(unexplained, 3),
                "rss_start_mb": round(rs[0]["rss_mb"], 1), "rss_end_mb": round(rs[-1]["rss_mb"], 1),
                "caches_end_mb": round(rs[-1]["caches_mb"], 1)}
        if all("live_less_caches_mb" in r for r in fit):  # not judged: where the unexplained part lives
            item["where"] = {key: slope(key) for key in HEAP_KEYS}
        out.append(item)
        if judged and unexplained is not None and unexplained >= threshold:
            failures.append(f"RSS less the caches' own bytes grows {unexplained:.2f} MB/min after warm-up "
                            f"(worker {seg['pid']}: RSS {item['rss_slope']:.2f}, caches {item['caches_slope']:.2f} "
                            f"MB/min; threshold {threshold:g})")
    # the headline: the longest segment (the one the run spent most time in)
    main = max(out, key=lambda x: x["end_s"] - x["start_s"]) if out else None
    return {"segments": out, "main": main, "judged": any(x["judged"] for x in out), "failures": failures}


def worker_balances(before: dict | None, samples: list, after: dict | None) -> list:
    """Each worker's (pid's) accounting from the /api/stats samples in time order: what it accepted and
    finished from `before` (for the worker seen first) or from zero (a worker started during the run:
    its counters start at zero) to its last sample; `lost` when that last sample found it idle."""
    first_pid = (before or {}).get("pid")
    last: dict = {}
    for x in [*samples, *([after] if after else [])]:
        if x is not None:
            last[x.get("pid")] = x  # insertion order: the order workers were seen in
    if not last and before is not None:
        last[first_pid] = before
    out = []
    for pid, end in last.items():
        acc, fin = _balance(before if pid == first_pid else {}, end)
        idle = not end.get("queue_depth") and not end.get("busy")
        out.append({"pid": pid, "accepted": acc, "finished": fin, "idle_at_last_sample": idle,
                    "lost": max(0, acc - fin) if idle else None})
    return out


def _balance(before: dict | None, after: dict | None) -> tuple[int, int]:
    """(requests the server accepted, requests it finished: completed, failed or cancelled) between two
    /api/stats samples, from its counters."""
    b = (before or {}).get("counters") or {}
    a = (after or {}).get("counters") or {}
    accepted = a.get("requests", 0) - b.get("requests", 0)
    finished = sum(a.get(k, 0) - b.get(k, 0) for k in ("completed", "errors", "cancelled"))
    return accepted, finished


def _error_label(status: int, body: bytes) -> str:
    try:
        code = json.loads(body)["error"]["code"]
    except Exception:
        code = None
    return f"{status} {code}" if code else str(status)


# --------------------------------------------------------------------------- the client threads

class Client(threading.Thread):
    def __init__(self, index: int, run: "Soak"):
        super().__init__(name=f"soak-{index}", daemon=True)
        self.index, self.run_ = index, run
        self.rng = random.Random(run.seed * 1000 + index)
        self.http = Http(run.url, run.api_key, run.timeout)
        self.history: list | None = None  # the last conversation of this thread, with the answer

    def run(self) -> None:
        kinds = list(self.run_.kinds)
        weights = [WEIGHTS[k] for k in kinds]
        # every kind early in the run (the threads share them out), then a weighted random mix
        first = [k for j, k in enumerate(kinds) if j % self.run_.concurrency == self.index]
        try:
            while time.monotonic() < self.run_.deadline and not self.run_.stop.is_set():
                kind = first.pop(0) if first else self.rng.choices(kinds, weights)[0]
                if kind == "follow_up" and not self.history:
                    kind = "new_image"  # a follow-up needs a conversation to follow
                if self.run_.fresh.is_set():  # a worker restart is under way: a new connection per request
                    self.http.reset()
                t0 = time.perf_counter()
                try:
                    outcome = getattr(self, "do_" + kind)()
                except (ConnectionFailed, requests.RequestException) as exc:  # no answer, or cut off mid-stream
                    outcome = Outcome(kind, "unexpected", "connection_error", 0.0, str(exc)[:300], lost=True)
                except Exception as exc:  # a bug in the soak itself must not look like a server fault
                    outcome = Outcome(kind, "unexpected", "client_exception", 0.0,
                                      f"{type(exc).__name__}: {exc}"[:300])
                outcome.kind = kind
                outcome.latency_ms = (time.perf_counter() - t0) * 1e3
                self.run_.tally.add(outcome)
                if outcome.result == "refused" and "503" in outcome.label:  # draining / not ready: back off,
                    self.http.reset()  # and come back on a new connection (to the worker that replaces it)
                    time.sleep(0.5)
        finally:
            self.http.close()

    # ----------------------------------------------------------------- helpers
    def _body(self, messages: list, max_tokens: int | None = None, **extra) -> dict:
        return {"model": "soak", "messages": messages, "max_tokens": max_tokens or self.run_.max_tokens,
                "temperature": 0, **extra}

    def _chat(self, kind: str, body: dict) -> tuple[Outcome, str | None]:
        """A non-streamed request with a valid body: (outcome, answer text)."""
        r = self.http.request("POST", "/v1/chat/completions", body)
        raw = r.content
        if r.status_code == 200:
            try:
                data = json.loads(raw)
                text = data["choices"][0]["message"]["content"]
                assert data["object"] == "chat.completion" and isinstance(text, str)
                assert "usage" in data and "timings" in data
            except Exception as exc:
                return Outcome(kind, "unexpected", "200 malformed", 0, f"{exc}: {raw[:200]!r}"), None
            return Outcome(kind, "ok", "200", 0), text
        label = _error_label(r.status_code, raw)
        if r.status_code in LOAD_REFUSALS:
            return Outcome(kind, "refused", label, 0), None
        return Outcome(kind, "unexpected", label, 0, raw[:300].decode(errors="replace")), None

    def _image(self, new: bool) -> str:
        run = self.run_
        if new or not run.pool:
            with run.lock:
                run.next_seed += 1
                seed = run.next_seed
            url = data_url(make_png(seed))
            with run.lock:
                run.pool.append(url)
                del run.pool[:-16]  # a few recent images to repeat
            return url
        with run.lock:
            return self.rng.choice(run.pool)

    def _ask(self, kind: str, new: bool) -> Outcome:
        msgs = [image_message(self._image(new), self.rng.choice(QUESTIONS))]
        outcome, text = self._chat(kind, self._body(msgs))
        if text is not None:
            self.history = msgs + [{"role": "assistant", "content": text}]
        return outcome

    # ----------------------------------------------------------------- kinds
    def do_new_image(self) -> Outcome:
        return self._ask("new_image", new=True)

    def do_repeat_image(self) -> Outcome:
        return self._ask("repeat_image", new=False)

    def do_clip(self) -> Outcome:
        """A question about a short MP4: a new clip, or one of the last few (the feature cache)."""
        run = self.run_
        with run.lock:
            pool = list(run.clips)
        if not pool or self.rng.random() < 0.5:
            with run.lock:
                run.next_seed += 1
                seed = run.next_seed
            url = data_url(make_mp4(seed), "video/mp4")
            with run.lock:
                run.clips.append(url)
                del run.clips[:-8]
        else:
            url = self.rng.choice(pool)
        msgs = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url, "detail": "low"}},
                                             {"type": "text", "text": "What happens in this clip?"}]}]
        return self._chat("clip", self._body(msgs))[0]

    def do_follow_up(self) -> Outcome:
        msgs = self.history + [{"role": "user", "content": self.rng.choice(FOLLOW_UPS)}]
        outcome, text = self._chat("follow_up", self._body(msgs))
        if text is not None:
            self.history = msgs + [{"role": "assistant", "content": text}] if len(msgs) < 9 else None
        return outcome

    def _stream(self, kind: str, close_after: int | None = None, cancel_api: bool = False) -> Outcome:
        """A streamed request. `close_after`: close after that many data events (a client going away);
        `cancel_api`: cancel it by id after the first event and read to the end."""
        msgs = [image_message(self._image(self.rng.random() < 0.5), self.rng.choice(QUESTIONS))]
        max_tokens = self.run_.max_tokens if close_after is None and not cancel_api else self.run_.cancel_tokens
        body = self._body(msgs, max_tokens, stream=True, stream_options={"include_usage": True},
                          result_cache=False)
        r = self.http.request("POST", "/v1/chat/completions", body, stream=True)
        if r.status_code != 200:
            raw = r.content
            label = _error_label(r.status_code, raw)
            if r.status_code in LOAD_REFUSALS:
                return Outcome(kind, "refused", label, 0)
            return Outcome(kind, "unexpected", label, 0, raw[:300].decode(errors="replace"))
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            r.close()
            return Outcome(kind, "unexpected", "200 not event-stream", 0, r.headers.get("content-type", ""))
        events, done, error, finish, req_id, cancel_status = 0, False, None, None, r.headers.get("x-request-id"), None
        try:
            for line in r.iter_lines(chunk_size=None):  # each line as it arrives
                if not line.startswith(b"data: "):
                    continue  # comments (queued, ping, stages) and blank separators
                payload = line[6:]
                if payload == b"[DONE]":
                    done = True
                    break
                events += 1
                try:
                    data = json.loads(payload)
                except ValueError:
                    return Outcome(kind, "unexpected", "bad_sse_event", 0, payload[:200].decode(errors="replace"))
                if "error" in data:
                    error = data["error"]
                    continue
                req_id = data.get("id", req_id)
                for ch in data.get("choices") or []:
                    finish = ch.get("finish_reason") or finish
                if close_after is not None and events >= close_after:
                    return Outcome(kind, "cancelled", "closed_by_client", 0)
                if cancel_api and cancel_status is None and req_id:
                    c = self.http.request("POST", f"/v1/chat/completions/{req_id}/cancel", timeout=30)
                    cancel_status = c.status_code
                    if c.status_code not in (200, 404):  # 404: it had already finished
                        return Outcome(kind, "unexpected", f"cancel {c.status_code}", 0)
        finally:
            r.close()
        if not done:
            if cancel_api:  # cancelled by us: the server should still end the stream properly
                return Outcome(kind, "unexpected", "incomplete_stream", 0, "no [DONE] after cancel", lost=True)
            return Outcome(kind, "unexpected", "incomplete_stream", 0, f"{events} events, no [DONE]", lost=True)
        if error is not None:
            code = error.get("code")
            if cancel_api and code == "cancelled":
                return Outcome(kind, "cancelled", "cancelled_by_api", 0)
            if code in ("server_busy", "queue_timeout"):
                return Outcome(kind, "refused", f"stream {code}", 0)
            return Outcome(kind, "unexpected", f"stream_error {code}", 0, str(error)[:300])
        if finish not in ("stop", "length"):
            return Outcome(kind, "unexpected", "no_finish_reason", 0)
        if cancel_api:  # finished before the cancel reached it (the cancel said 404 or came too late)
            return Outcome(kind, "ok", "200 finished_before_cancel", 0)
        return Outcome(kind, "ok", "200", 0)

    def do_stream(self) -> Outcome:
        return self._stream("stream")

    def do_cancel_close(self) -> Outcome:
        return self._stream("cancel_close", close_after=self.rng.randint(1, 3))

    def do_cancel_api(self) -> Outcome:
        return self._stream("cancel_api", cancel_api=True)

    def _bad(self, kind: str, body=None, raw: bytes | None = None) -> Outcome:
        r = self.http.request("POST", "/v1/chat/completions", body, raw=raw)
        data = r.content
        label = _error_label(r.status_code, data)
        if r.status_code == 400:
            try:
                err = json.loads(data)["error"]
                assert {"message", "type", "param", "code"} <= set(err)
            except Exception:
                return Outcome(kind, "unexpected", "400 malformed_error", 0, data[:200].decode(errors="replace"))
            return Outcome(kind, "refused", label, 0)
        if r.status_code in LOAD_REFUSALS:
            return Outcome(kind, "refused", label, 0)
        return Outcome(kind, "unexpected", label, 0, f"bad input answered {r.status_code}: {data[:200]!r}")

    def do_bad_base64(self) -> Outcome:
        return self._bad("bad_base64", self._body([image_message("data:image/png;base64,!!not*base64!!", "Hi")]))

    def do_not_image(self) -> Outcome:
        junk = base64.b64encode(b"this is plain text, not an image " * 4).decode()
        return self._bad("not_image", self._body([image_message("data:image/png;base64," + junk, "Hi")]))

    def do_bad_json(self) -> Outcome:
        return self._bad("bad_json", raw=b'{"messages": [{"role": "user", "content": "Hi"}')

    def do_over_cap(self) -> Outcome:
        body = self._body([{"role": "user", "content": "Hi"}])
        body["max_tokens"] = self.run_.cap + 1
        return self._bad("over_cap", body)


# --------------------------------------------------------------------------- managed mode

class Managed:
    """`--serve`: a real redis-server and Gunicorn started as users start them (one worker, the caches'
    shared tier in that Redis), and the run's two faults: Redis paused (SIGSTOP, then SIGCONT) once,
    and a rolling SIGTERM of the worker once (Gunicorn's master starts a new one; the old one drains).
    Both are recorded as events with their times. Reuses the bench's helpers (tools/services.py,
    tools/concurrency.py)."""

    def __init__(self, args, workdir: str):
        from pathlib import Path

        self.args = args
        self.workdir = Path(workdir)
        self.redis = None
        self.server = None
        self.events: list = []

    def start(self) -> str:
        from .harness import Server
        from .services import RedisProcess

        self.redis = RedisProcess(self.workdir).start()
        env = {"VL_MODEL": self.args.model, "VL_WORKERS": "1", "VL_REDIS_URL": self.redis.url,
               "HF_HUB_OFFLINE": "1"}
        for pair in self.args.server_env or ():
            key, _, value = pair.partition("=")
            env[key.strip()] = value
        self.server = Server(env, self.workdir / "server.log")
        self.server.wait_ready(timeout=600)
        return self.server.url

    def worker_pids(self) -> list:
        import psutil

        try:
            return [p.pid for p in psutil.Process(self.server.proc.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def pause_redis(self, run: "Soak", seconds: float) -> None:
        pid = self.redis.proc.pid
        os.kill(pid, sig.SIGSTOP)
        run.event("redis_paused", pid=pid, seconds=seconds)
        try:
            run.stop.wait(seconds)
        finally:
            os.kill(pid, sig.SIGCONT)
            run.event("redis_resumed", pid=pid)

    def rolling_sigterm(self, run: "Soak", http: Http) -> None:
        """SIGTERM the worker (as a rolling update does); clients use a new connection per request
        until its replacement answers /readyz. The old worker is sampled while it drains."""
        old = self.worker_pids()
        if len(old) != 1:
            run.event("sigterm_skipped", reason=f"expected one worker, found {old}")
            return
        run.fresh.set()
        time.sleep(0.5)  # clients between requests drop their kept-alive connections first
        os.kill(old[0], sig.SIGTERM)
        run.event("worker_sigterm", pid=old[0])
        t0 = time.monotonic()
        new: list = []
        while time.monotonic() - t0 < 120:
            run.sample(http)  # the draining worker's counters, as long as it answers
            new = [p for p in self.worker_pids() if p not in old]
            if new and old[0] not in self.worker_pids():
                break
            time.sleep(0.5)
        run.event("worker_exited", pid=old[0], after_s=round(time.monotonic() - t0, 1))
        while time.monotonic() - t0 < 180:
            try:
                if http.request("GET", "/readyz", timeout=5).status_code == 200:
                    break
            except ConnectionFailed:
                pass
            time.sleep(0.5)
        run.event("worker_ready", pid=new[0] if new else None, after_s=round(time.monotonic() - t0, 1))
        time.sleep(2.0)
        run.fresh.clear()

    def faults(self, run: "Soak") -> None:
        """Redis paused at a quarter of the run, the worker SIGTERMed at 55%."""
        http = Http(run.url, run.api_key, run.timeout)
        try:
            if not run.stop.wait(max(0.0, run.t_start + 0.25 * run.duration_s - time.monotonic())):
                self.pause_redis(run, self.args.redis_pause)
            if not run.stop.wait(max(0.0, run.t_start + 0.55 * run.duration_s - time.monotonic())):
                self.rolling_sigterm(run, http)
        except Exception as exc:  # recorded: a fault that was not injected fails the run
            run.event("fault_error", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            http.close()

    def stop(self) -> None:
        if self.redis is not None and self.redis.proc is not None and self.redis.proc.poll() is None:
            os.kill(self.redis.proc.pid, sig.SIGCONT)  # never leave it stopped
        if self.server is not None:
            self.server.stop()
        if self.redis is not None:
            self.redis.stop()


# --------------------------------------------------------------------------- the run

class Soak:
    def __init__(self, args):
        self.url = args.url.rstrip("/")
        self.command = getattr(args, "command", "python -m vlservice soak")
        self.api_key = args.api_key or ""
        self.duration_s = args.seconds if args.seconds is not None else args.minutes * 60.0
        self.concurrency = args.concurrency
        self.kinds = tuple(args.kinds or KINDS)
        self.max_tokens = args.max_tokens
        self.sample_every = args.sample_every
        self.max_slope = args.max_rss_slope
        self.timeout = args.timeout
        self.seed = args.seed
        self.tally = Tally()
        self.lock = threading.Lock()
        self.pool: list = []
        self.next_seed = self.seed * 100_000
        self.stop = threading.Event()
        self.samples: list = []  # (t_s since start, stats dict)
        self.stats_errors = 0
        self.stats_error = ""  # the last failed sample's reason, for the report
        self.http = Http(self.url, self.api_key, self.timeout)
        self.sampler_http = Http(self.url, self.api_key, self.timeout)  # its own: a Session is one thread's
        self.cap = 1024
        self.cancel_tokens = 64
        self.deadline = 0.0
        self.t0 = 0.0
        self.t_start = 0.0  # when the traffic started (monotonic)
        self.warmup_s = args.warmup
        self.clips: list = []
        self.fresh = threading.Event()  # set around a worker restart: clients open a new connection per request
        self.events: list = []  # the managed run's faults: (t_s, name, details)
        self.managed: Managed | None = None
        self.samples_lock = threading.Lock()

    def event(self, name: str, **details) -> None:
        with self.samples_lock:
            self.events.append({"t_s": round(time.monotonic() - self.t0, 1), "event": name, **details})

    def sample(self, http: Http | None = None) -> dict | None:
        try:
            s = (http or self.http).get_json("/api/stats")
        except Exception as exc:
            self.stats_errors += 1
            self.stats_error = f"{type(exc).__name__}: {exc}"[:300]
            return None
        with self.samples_lock:
            self.samples.append((time.monotonic() - self.t0, s))
        return s

    def _sampler(self) -> None:
        while not self.stop.wait(self.sample_every):
            if time.monotonic() >= self.deadline:
                return
            self.sample(self.sampler_http)

    def drain(self, before: dict, limit_s: float = 60.0) -> dict | None:
        """Wait until the server has nothing queued or running and every request it accepted since
        `before` has finished (a cancelled one may still be on its way out of the scheduler); the last sample."""
        end = time.monotonic() + limit_s
        s = None
        while time.monotonic() < end:
            s = self.sample()
            if s is not None and not s.get("queue_depth") and not s.get("busy"):
                # a worker started during the run (a rolling restart) counts from zero
                accepted, finished = _balance(before if s.get("pid") == before.get("pid") else {}, s)
                if finished >= accepted:
                    return s
            time.sleep(0.5)
        return s

    def run(self) -> dict:
        self.t0 = time.monotonic()
        config = self.http.get_json("/api/config")
        self.cap = int(config.get("max_tokens_cap", 1024))
        self.max_tokens = max(1, min(self.max_tokens, self.cap))
        self.cancel_tokens = max(1, min(self.cap, self.max_tokens * 4))
        before = self.sample()
        if before is None:
            raise ConnectionFailed(f"GET {self.url}/api/stats failed")
        started = time.time()
        self.t_start = time.monotonic()
        self.deadline = time.monotonic() + self.duration_s
        sampler = threading.Thread(target=self._sampler, name="soak-sampler", daemon=True)
        sampler.start()
        faults = None
        if self.managed is not None:
            faults = threading.Thread(target=self.managed.faults, args=(self,), name="soak-faults", daemon=True)
            faults.start()
        clients = [Client(i, self) for i in range(self.concurrency)]
        for c in clients:
            c.start()
        for c in clients:  # a request started before the deadline may finish after it
            c.join(max(0.0, self.deadline - time.monotonic()) + self.timeout + 15)
        hung = sum(c.is_alive() for c in clients)
        if faults is not None:  # a restart under way finishes (the new worker answers) before the drain
            faults.join(200)
        self.stop.set()
        sampler.join(15)  # longer than one sample's timeout
        self.sampler_http.close()
        elapsed = time.monotonic() - self.t0
        after = self.drain(before)
        healthy = True
        try:
            healthy = self.http.get_json("/healthz", timeout=10).get("status") == "ok"
        except Exception:
            healthy = False
        self.http.close()
        return self.report(config, before, after, started, elapsed, hung, healthy)

    # ----------------------------------------------------------------- the report
    def report(self, config, before, after, started, elapsed, hung, healthy) -> dict:
        outcomes = list(self.tally.outcomes)
        kinds = {}
        for kind in KINDS:
            mine = [o for o in outcomes if o.kind == kind]
            lat = [o.latency_ms for o in mine]
            kinds[kind] = {"sent": len(mine), "ok": sum(o.result == "ok" for o in mine),
                           "cancelled": sum(o.result == "cancelled" for o in mine),
                           "refused": sum(o.result == "refused" for o in mine),
                           "unexpected": sum(o.result == "unexpected" for o in mine),
                           "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95)}
        refusals, unexpected = defaultdict(int), defaultdict(int)
        for o in outcomes:
            if o.result == "refused":
                refusals[o.label] += 1
            elif o.result == "unexpected":
                unexpected[o.label] += 1
        examples = [{"kind": o.kind, "label": o.label, "detail": o.detail}
                    for o in outcomes if o.result == "unexpected"][:10]
        lost_client = sum(o.lost for o in outcomes)

        workers = worker_balances(before, [x for _, x in self.samples], after)
        last_of = {x.get("pid"): x for x in [*(x for _, x in self.samples), *([after] if after else [])] if x}
        for w in workers:  # each worker's view of the shared tier (a Redis pause shows as fallbacks/outages)
            shared = (last_of.get(w["pid"]) or {}).get("shared_cache") or {}
            w["shared_cache"] = {k: v for k, v in shared.items() if k != "url"} or None
        accepted = sum(w["accepted"] for w in workers)
        finished = sum(w["finished"] for w in workers)
        drained = after is not None and not after.get("queue_depth") and not after.get("busy")
        # the worker serving at the end must balance; one replaced during the run balances if its last
        # sample caught it idle (otherwise its last requests are judged by the clients' outcomes)
        lost_server = sum(w["lost"] or 0 for w in workers) if drained else None

        with self.samples_lock:
            samples = list(self.samples)
        rows = [r for r in (memory_row(t, x) for t, x in samples) if r is not None]
        verdict = memory_verdict(rows, self.max_slope, self.warmup_s)
        main = verdict["main"] or {}
        last = (after or (samples[-1][1] if samples else {})) or {}
        caches = {}
        for name, label, setting in CACHES:
            c = last.get(name) or {}
            if c:
                cap = c.get("capacity_bytes") or 0
                caches[name] = {"label": label, "setting": setting, "bytes": c.get("bytes"), "capacity_bytes": cap,
                                "entries": c.get("entries"), "evictions": c.get("evictions"),
                                "fill": round(c["bytes"] / cap, 3) if cap and c.get("bytes") is not None else None}
        memory = {
            "rss_start_mb": round(rows[0]["rss_mb"], 1) if rows else None,
            "rss_end_mb": round(rows[-1]["rss_mb"], 1) if rows else None,
            "rss_max_mb": round(max(r["rss_mb"] for r in rows), 1) if rows else None,
            "caches_end_mb": round(rows[-1]["caches_mb"], 1) if rows else None,
            "slope_mb_per_min": main.get("rss_slope"),
            "caches_slope_mb_per_min": main.get("caches_slope"),
            "unexplained_slope_mb_per_min": main.get("unexplained_slope"),
            "slope_fit": (f"worker {main.get('pid')}, samples after the first {self.warmup_s:g} s" if main.get("judged")
                          else "all samples (not judged: too short)"),
            "trend_judged": verdict["judged"], "threshold_mb_per_min": self.max_slope, "warmup_s": self.warmup_s,
            "segments": verdict["segments"], "caches": caches,
            "samples": [[round(r["t"], 1), round(r["rss_mb"], 1), round(r["caches_mb"], 1), r["queue_depth"], r["pid"]]
                        for r in rows],
            # the allocator's view of the same samples (none where it has no statistics)
            "heap_samples_fields": ["t_s", "live_less_caches_mb", "heap_free_mb", "rss_anon_mb"],
            "heap_samples": [[round(r["t"], 1), *(round(r[k], 1) for k in HEAP_KEYS)] for r in rows
                             if all(k in r for k in HEAP_KEYS)],
        }
        n_unexpected = sum(unexpected.values())
        reasons = []
        if n_unexpected:
            reasons.append(f"{n_unexpected} unexpected outcome(s): " + ", ".join(f"{k} x{v}" for k, v in
                                                                               sorted(unexpected.items())))
        if lost_client:
            reasons.append(f"{lost_client} request(s) lost (connection error or incomplete stream)")
        if lost_server is None:
            reasons.append("the server did not drain (queue or model still busy 60 s after the run)")
        elif lost_server:
            reasons.append(f"{lost_server} accepted request(s) never finished on the server")
        if hung:
            reasons.append(f"{hung} client thread(s) still waiting for an answer")
        if not healthy:
            reasons.append("/healthz did not answer after the run")
        if self.stats_errors:
            reasons.append(f"{self.stats_errors} /api/stats sample(s) failed (last: {self.stats_error})")
        reasons += verdict["failures"]
        if self.managed is not None:
            names = {e["event"] for e in self.events}
            missing = [n for n in ("redis_paused", "redis_resumed", "worker_sigterm", "worker_ready") if n not in names]
            if missing:
                reasons.append("managed faults not all injected: missing " + ", ".join(missing)
                               + "".join(f"; {e['event']}: {e.get('error') or e.get('reason')}" for e in self.events
                                         if e["event"] in ("fault_error", "sigterm_skipped")))
        if not outcomes:
            reasons.append("no request was sent")
        stats_keys = ("pid", "rss_bytes", "queue_depth", "busy", "cache", "kv_cache", "result_cache", "shared_cache",
                      "counters", "encoder_calls", "heap")
        from ..obs.records import cpu_info

        return {
            # the machine the clients and (with --serve) the server ran on, and the command
            "cpu": cpu_info(0), "command": self.command,
            "url": self.url, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "duration_s": round(elapsed, 1), "concurrency": self.concurrency, "max_tokens": self.max_tokens,
            "model": config.get("model"), "max_tokens_cap": self.cap,
            "kinds": kinds,
            "totals": {"sent": len(outcomes), "ok": sum(o.result == "ok" for o in outcomes),
                       "cancelled": sum(o.result == "cancelled" for o in outcomes),
                       "expected_refusals": sum(refusals.values()), "unexpected": n_unexpected,
                       "lost": lost_client + (lost_server or 0)},
            "expected_refusals": dict(sorted(refusals.items())),
            "unexpected": dict(sorted(unexpected.items())),
            "unexpected_examples": examples,
            "managed": self.managed is not None, "events": list(self.events),
            "server": {"accepted": accepted, "finished": finished, "lost": lost_server, "drained": drained,
                       "workers": workers,
                       "healthy_after": healthy, "stats_samples": len(self.samples),
                       "stats_errors": self.stats_errors,
                       "before": {k: (before or {}).get(k) for k in stats_keys},
                       "after": {k: (after or {}).get(k) for k in stats_keys}},
            "memory": memory,
            "verdict": "FAIL" if reasons else "PASS",
            "reasons": reasons,
        }


def markdown(rep: dict) -> str:
    from .harness import md_table

    def f(v):
        return "-" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))

    lines = [f"## Soak: {rep['url']} ({rep['model']}), {rep['duration_s']} s, {rep['concurrency']} clients, "
             f"max_tokens {rep['max_tokens']}", ""]
    t = rep["totals"]
    kinds = [[kind, k["sent"], k["ok"], k["cancelled"], k["refused"], k["unexpected"], f(k["p50_ms"]), f(k["p95_ms"])]
             for kind, k in rep["kinds"].items()]
    kinds.append(["**total**", t["sent"], t["ok"], t["cancelled"], t["expected_refusals"], t["unexpected"], "", ""])
    lines += md_table(["kind", "sent", "ok", "cancelled", "refused (expected)", "unexpected", "p50 ms", "p95 ms"],
                      kinds, colalign=("left",) + ("right",) * 7)
    outcomes = ([[f"expected: {label}", n] for label, n in rep["expected_refusals"].items()]
                + [[f"**unexpected: {label}**", n] for label, n in rep["unexpected"].items()]
                + [["lost requests", t["lost"]]])
    lines += ["", *md_table(["outcome", "count"], outcomes, colalign=("left", "right"))]
    m, s = rep["memory"], rep["server"]
    rows = [["RSS start / end / max (MB)", f"{f(m['rss_start_mb'])} / {f(m['rss_end_mb'])} / {f(m['rss_max_mb'])}"],
            ["caches' own bytes at the end (MB)", f(m["caches_end_mb"])],
            [f"RSS slope (MB/min, {m['slope_fit']})", f(m["slope_mb_per_min"])],
            ["caches' slope (MB/min, same samples)", f(m["caches_slope_mb_per_min"])],
            ["RSS less caches: slope (MB/min, the verdict's)", f(m["unexplained_slope_mb_per_min"])],
            ["growth threshold (MB/min, RSS less caches)", f"< {f(m['threshold_mb_per_min'])}"],
            ["server: accepted / finished", f"{s['accepted']} / {s['finished']}"],
            ["/api/stats samples", s["stats_samples"]]]
    for c in m.get("caches", {}).values():
        fill = "-" if c.get("fill") is None else f"{100 * c['fill']:.1f}%"
        used = "-" if c.get("bytes") is None else f"{c['bytes'] / MB:.1f}"
        rows.append([f"{c['label']} ({c['setting']}): MB / budget", f"{used} / {(c['capacity_bytes'] or 0) / MB:.0f} "
                     f"({fill}, {f(c.get('entries'))} entries, {f(c.get('evictions'))} evictions)"])
    for seg in m.get("segments", []):
        rows.append([f"worker {seg['pid']} ({seg['start_s']}-{seg['end_s']} s, {seg['samples']} samples, "
                     f"{seg['fit']}): RSS / caches / RSS less caches (MB/min)",
                     f"{f(seg['rss_slope'])} / {f(seg['caches_slope'])} / {f(seg['unexplained_slope'])}"])
        if seg.get("where"):
            w = seg["where"]
            rows.append([f"worker {seg['pid']}: the allocator's live bytes less the caches / free but held / RssAnon (MB/min)",
                         f"{f(w['live_less_caches_mb'])} / {f(w['heap_free_mb'])} / {f(w['rss_anon_mb'])}"])
    for e in rep.get("events", []):
        details = ", ".join(f"{k} {v}" for k, v in e.items() if k not in ("t_s", "event"))
        rows.append([f"event at {e['t_s']} s", f"{e['event']}{': ' + details if details else ''}"])
    for w in s.get("workers", []):
        rows.append([f"worker {w['pid']}: accepted / finished", f"{w['accepted']} / {w['finished']}"
                     + ("" if w["idle_at_last_sample"] else " (replaced while busy: its clients' outcomes count)")])
        if w.get("shared_cache"):
            rows.append([f"worker {w['pid']}: shared cache (Redis)",
                         ", ".join(f"{k} {v}" for k, v in w["shared_cache"].items())])
    after = s["after"] or {}
    for name in ("cache", "kv_cache", "result_cache"):
        c = after.get(name) or {}
        if c:
            rows.append([f"{name}: hits / misses / entries", f"{c.get('hits')} / {c.get('misses')} / {c.get('entries')}"])
    for ex in rep["unexpected_examples"][:5]:
        rows.append([f"example: {ex['kind']} {ex['label']}", ex["detail"][:100].replace("|", "/")])
    lines += ["", *md_table(["memory / server", "value"], rows, colalign=("left", "right"))]
    verdict = rep["verdict"]
    why = "; ".join(rep["reasons"]) if rep["reasons"] else (
        "no unexpected outcome, no lost request, "
        + (f"RSS less the caches' own bytes grows {f(m['unexplained_slope_mb_per_min'])} MB/min "
           f"< {f(m['threshold_mb_per_min'])} (RSS itself {f(m['slope_mb_per_min'])})" if m["trend_judged"]
           else "memory trend not judged (needs samples over at least a minute after the warm-up)"))
    lines += ["", f"**Verdict: {verdict}** ({why})"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vlservice soak",
                                description="Mixed traffic against a running vlservice for a fixed time; exit 0 "
                                            "on PASS, 1 on FAIL.")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (only this URL is contacted)")
    length = p.add_mutually_exclusive_group(required=True)
    length.add_argument("--minutes", type=float, help="how long to send traffic")
    length.add_argument("--seconds", type=float, help="the same in seconds (short runs, tests)")
    p.add_argument("--concurrency", type=int, default=3, help="client threads (default 3)")
    p.add_argument("--kinds", nargs="+", metavar="KIND",
                   help="send only these kinds of request (default: all; to find which traffic grows memory)")
    p.add_argument("--api-key", default="", help="sent as Authorization: Bearer on every request")
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON to this file")
    p.add_argument("--max-tokens", type=int, default=16, help="answer length of the valid requests (default 16; "
                                                             "cancellations ask for 4x)")
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between /api/stats samples")
    p.add_argument("--max-rss-slope", type=float, default=2.0,
                   help="growth threshold in MB/min of RSS less the caches' own accounted bytes, after the "
                        "warm-up (default 2)")
    p.add_argument("--warmup", type=float, default=WARMUP_S,
                   help="seconds of each worker's samples left out of the trend (default 60)")
    managed = p.add_argument_group("managed mode (--serve)")
    managed.add_argument("--serve", action="store_true",
                         help="start a redis-server and Gunicorn (one worker, VL_REDIS_URL to that Redis) and soak "
                              "them, pausing Redis once and SIGTERMing the worker once (--url is ignored)")
    managed.add_argument("--model", default="demo", help="VL_MODEL of the managed server (default demo)")
    managed.add_argument("--server-env", nargs="+", metavar="VL_NAME=VALUE",
                         help="more settings for the managed server (e.g. VL_KV_CACHE_MB=256)")
    managed.add_argument("--redis-pause", type=float, default=10.0,
                         help="seconds Redis stays stopped (SIGSTOP) at a quarter of the run (default 10)")
    managed.add_argument("--serve-dir", help="folder for the managed server's log (default: a new temporary one)")
    managed.add_argument("--allocators", nargs="+", metavar="NAME",
                         help="run the managed soak once per allocator setting, one after the other, and compare "
                              "them in one report (glibc, glibc-arenas2, glibc-trim, jemalloc, tcmalloc)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for one answer")
    p.add_argument("--seed", type=int, default=0, help="seed of the traffic mix and the images")
    return p


def run_once(args, duration: float) -> dict | int:
    """One soak as `args` say (starting the managed server with --serve): its report, or an exit
    code when it could not run."""
    managed = None
    if args.serve:
        import shutil
        import tempfile

        if not shutil.which("redis-server"):
            print("error: --serve needs redis-server (apt-get install redis-server)", file=sys.stderr)
            return 2
        workdir = args.serve_dir or tempfile.mkdtemp(prefix="vlservice-soak-")
        os.makedirs(workdir, exist_ok=True)
        managed = Managed(args, workdir)
        print(f"soak: starting redis-server and Gunicorn ({args.model}, one worker); log in {workdir}",
              file=sys.stderr)
        try:
            args.url = managed.start()
        except Exception as exc:
            managed.stop()
            print(f"error: the managed server did not start: {exc}", file=sys.stderr)
            return 2
    soak = Soak(args)
    soak.managed = managed
    print(f"soak: {duration:g} s against {soak.url} with {args.concurrency} client(s)", file=sys.stderr)
    try:
        rep = soak.run()
    except (ConnectionFailed, ValueError) as exc:
        print(f"error: cannot soak {soak.url}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        soak.stop.set()
        print("interrupted", file=sys.stderr)
        return 1
    finally:
        if managed is not None:
            managed.stop()
    if managed is not None:
        rep["server_log"] = str(managed.workdir / "server.log")
    return rep


def main(argv: list | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command = "python -m vlservice soak " + " ".join(argv)  # as run (the records' `command`)
    duration = args.seconds if args.seconds is not None else args.minutes * 60.0
    unknown = sorted(set(args.kinds or ()) - set(KINDS))
    if unknown:
        print(f"error: unknown kind(s) {', '.join(unknown)}; choose from {', '.join(KINDS)}", file=sys.stderr)
        return 2
    if not duration > 0 or args.concurrency < 1 or args.max_tokens < 1 or args.sample_every <= 0:
        print("error: --minutes/--seconds, --concurrency, --max-tokens and --sample-every must be positive",
              file=sys.stderr)
        return 2
    if args.allocators:
        from .soakcompare import compare

        return compare(args, duration, run_once)
    rep = run_once(args, duration)
    if isinstance(rep, int):
        return rep
    print(markdown(rep))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rep, fh, indent=2)
    return 0 if rep["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
