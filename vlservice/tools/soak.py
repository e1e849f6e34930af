"""`python -m vlservice soak`: mixed traffic against a running server for a fixed time, then a verdict.

    python -m vlservice soak --url http://127.0.0.1:8000 --minutes 30 [--concurrency 3]
                             [--api-key K] [--json report.json]

C client threads send, until the deadline, a mix of: questions about new images (small PNGs drawn
with OpenCV from varied seeds), repeated images (feature / result cache), follow-up questions (the
history with the previous answer: KV-cache reuse), streamed answers, cancellations (a stream read
for a few chunks and closed, or cancelled with POST /v1/chat/completions/<id>/cancel) and bad
inputs (invalid base64, data that is not an image, broken JSON, max_tokens over the cap). Only the
given URL is contacted. `/api/stats` is sampled before, every `--sample-every` seconds during and
after the run (after the queue has drained).

The report (a Markdown table on stdout, optionally JSON) has requests by kind, answers served,
expected refusals (400 for bad inputs; 429/503 under load) apart from unexpected outcomes (5xx,
a 4xx for a valid request, a bad input accepted, connection errors, streams without `[DONE]` that
we did not cancel), p50/p95 latency per kind, the worker's RSS at start and end and its trend:
the least-squares slope of RSS over time, in MB per minute, fitted to the samples after the first
minute (warm-up: caches fill).

Verdict PASS when there was no unexpected outcome, no lost request (no connection error, no
incomplete stream, and the server's own counters show every accepted request finished once the
queue drained) and no growth trend (slope below `--max-rss-slope`, 5 MB/min by default; judged
only when there are at least 3 samples spanning a minute after the first minute, otherwise "not
judged"). Exit code 0 on PASS, 1 on FAIL, 2 on bad usage or when the server cannot be reached.

HTTP goes through `requests` (a tool dependency: `pip install -r vlservice/tools/requirements.txt`);
numpy and OpenCV (dependencies of the service) draw the images. `/api/stats` describes one Gunicorn worker:
run the server with one worker for a meaningful memory trend.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import requests

GOOD_KINDS = ("new_image", "repeat_image", "follow_up", "stream")
CANCEL_KINDS = ("cancel_close", "cancel_api")
BAD_KINDS = ("bad_base64", "not_image", "bad_json", "over_cap")
KINDS = GOOD_KINDS + CANCEL_KINDS + BAD_KINDS
WEIGHTS = {"new_image": 3, "repeat_image": 2, "follow_up": 2, "stream": 2, "cancel_close": 1, "cancel_api": 1,
           "bad_base64": 1, "not_image": 1, "bad_json": 1, "over_cap": 1}
LOAD_REFUSALS = (429, 503)  # busy / queue timeout: the server protecting itself, expected under load
QUESTIONS = ("Describe this image.", "What shapes do you see?", "What colours are in the picture?",
             "How many circles are there?", "Is there any text?")
FOLLOW_UPS = ("Tell me more.", "Which one is the largest?", "And the background colour?", "Say it in one word.")
WARMUP_S = 60.0
MB = 1024 * 1024


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


# --------------------------------------------------------------------------- the run

class Soak:
    def __init__(self, args):
        self.url = args.url.rstrip("/")
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

    def sample(self, http: Http | None = None) -> dict | None:
        try:
            s = (http or self.http).get_json("/api/stats")
        except Exception as exc:
            self.stats_errors += 1
            self.stats_error = f"{type(exc).__name__}: {exc}"[:300]
            return None
        self.samples.append((time.monotonic() - self.t0, s))
        return s

    def _sampler(self) -> None:
        while not self.stop.wait(self.sample_every):
            if time.monotonic() >= self.deadline:
                return
            self.sample(self.sampler_http)

    def drain(self, before: dict, limit_s: float = 60.0) -> dict | None:
        """Wait until the server has nothing queued or running and every request it accepted since
        `before` has finished (a cancelled one may still be on its way to the lock); the last sample."""
        end = time.monotonic() + limit_s
        s = None
        while time.monotonic() < end:
            s = self.sample()
            if s is not None and not s.get("queue_depth") and not s.get("busy"):
                accepted, finished = _balance(before, s)
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
        self.deadline = time.monotonic() + self.duration_s
        sampler = threading.Thread(target=self._sampler, name="soak-sampler", daemon=True)
        sampler.start()
        clients = [Client(i, self) for i in range(self.concurrency)]
        for c in clients:
            c.start()
        for c in clients:  # a request started before the deadline may finish after it
            c.join(max(0.0, self.deadline - time.monotonic()) + self.timeout + 15)
        hung = sum(c.is_alive() for c in clients)
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

        accepted, finished = _balance(before, after)
        drained = after is not None and not after.get("queue_depth") and not after.get("busy")
        lost_server = max(0, accepted - finished) if drained else None

        points = [(t, s["rss_bytes"] / MB) for t, s in self.samples if isinstance(s.get("rss_bytes"), int)]
        after_warmup = [(t, v) for t, v in points if t >= WARMUP_S]
        judged = len(after_warmup) >= 3 and after_warmup[-1][0] - after_warmup[0][0] >= 60.0
        slope_all = slope_per_minute(points)
        slope = slope_per_minute(after_warmup) if judged else slope_all
        memory = {
            "rss_start_mb": round(points[0][1], 1) if points else None,
            "rss_end_mb": round(points[-1][1], 1) if points else None,
            "rss_max_mb": round(max(v for _, v in points), 1) if points else None,
            "slope_mb_per_min": None if slope is None else round(slope, 3),
            "slope_fit": "samples after the first minute" if judged else "all samples (not judged: too short)",
            "trend_judged": judged, "threshold_mb_per_min": self.max_slope,
            "samples": [[round(t, 1), round(s["rss_bytes"] / MB, 1), s.get("queue_depth")]
                        for t, s in self.samples if isinstance(s.get("rss_bytes"), int)],
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
        if judged and slope is not None and slope >= self.max_slope:
            reasons.append(f"RSS grows {slope:.2f} MB/min after the first minute (threshold {self.max_slope})")
        if not outcomes:
            reasons.append("no request was sent")
        stats_keys = ("rss_bytes", "queue_depth", "busy", "cache", "kv_cache", "result_cache", "counters",
                      "encoder_calls")
        return {
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
            "server": {"accepted": accepted, "finished": finished, "lost": lost_server, "drained": drained,
                       "healthy_after": healthy, "stats_samples": len(self.samples),
                       "stats_errors": self.stats_errors,
                       "before": {k: (before or {}).get(k) for k in stats_keys},
                       "after": {k: (after or {}).get(k) for k in stats_keys}},
            "memory": memory,
            "verdict": "FAIL" if reasons else "PASS",
            "reasons": reasons,
        }


def markdown(rep: dict) -> str:
    def f(v):
        return "-" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))

    lines = [f"## Soak: {rep['url']} ({rep['model']}), {rep['duration_s']} s, {rep['concurrency']} clients, "
             f"max_tokens {rep['max_tokens']}", "",
             "| kind | sent | ok | cancelled | refused (expected) | unexpected | p50 ms | p95 ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kind, k in rep["kinds"].items():
        lines.append(f"| {kind} | {k['sent']} | {k['ok']} | {k['cancelled']} | {k['refused']} | {k['unexpected']} "
                     f"| {f(k['p50_ms'])} | {f(k['p95_ms'])} |")
    t = rep["totals"]
    lines.append(f"| **total** | {t['sent']} | {t['ok']} | {t['cancelled']} | {t['expected_refusals']} "
                 f"| {t['unexpected']} | | |")
    lines += ["", "| outcome | count |", "| --- | ---: |"]
    for label, n in rep["expected_refusals"].items():
        lines.append(f"| expected: {label} | {n} |")
    for label, n in rep["unexpected"].items():
        lines.append(f"| **unexpected: {label}** | {n} |")
    lines.append(f"| lost requests | {t['lost']} |")
    m, s = rep["memory"], rep["server"]
    lines += ["", "| memory / server | value |", "| --- | ---: |",
              f"| RSS start / end / max (MB) | {f(m['rss_start_mb'])} / {f(m['rss_end_mb'])} / {f(m['rss_max_mb'])} |",
              f"| RSS slope (MB/min, {m['slope_fit']}) | {f(m['slope_mb_per_min'])} |",
              f"| growth threshold (MB/min) | < {f(m['threshold_mb_per_min'])} |",
              f"| server: accepted / finished | {s['accepted']} / {s['finished']} |",
              f"| /api/stats samples | {s['stats_samples']} |"]
    after = s["after"] or {}
    for name in ("cache", "kv_cache", "result_cache"):
        c = after.get(name) or {}
        if c:
            lines.append(f"| {name}: hits / misses / entries | {c.get('hits')} / {c.get('misses')} / "
                         f"{c.get('entries')} |")
    for ex in rep["unexpected_examples"][:5]:
        lines.append(f"| example: {ex['kind']} {ex['label']} | {ex['detail'][:100].replace('|', '/')} |")
    verdict = rep["verdict"]
    why = "; ".join(rep["reasons"]) if rep["reasons"] else (
        "no unexpected outcome, no lost request, "
        + (f"RSS slope {f(m['slope_mb_per_min'])} MB/min < {f(m['threshold_mb_per_min'])}" if m["trend_judged"]
           else "memory trend not judged (needs samples over at least a minute after the first minute)"))
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
    p.add_argument("--max-rss-slope", type=float, default=5.0,
                   help="RSS growth threshold in MB/min after the first minute (default 5)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for one answer")
    p.add_argument("--seed", type=int, default=0, help="seed of the traffic mix and the images")
    return p


def main(argv: list | None = None) -> int:
    args = build_parser().parse_args(argv)
    duration = args.seconds if args.seconds is not None else args.minutes * 60.0
    unknown = sorted(set(args.kinds or ()) - set(KINDS))
    if unknown:
        print(f"error: unknown kind(s) {', '.join(unknown)}; choose from {', '.join(KINDS)}", file=sys.stderr)
        return 2
    if not duration > 0 or args.concurrency < 1 or args.max_tokens < 1 or args.sample_every <= 0:
        print("error: --minutes/--seconds, --concurrency, --max-tokens and --sample-every must be positive",
              file=sys.stderr)
        return 2
    soak = Soak(args)
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
    print(markdown(rep))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rep, fh, indent=2)
    return 0 if rep["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
