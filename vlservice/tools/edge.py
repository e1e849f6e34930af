"""The adversarial table: what a hostile client can send, and what the server must answer.

Each case is raw bytes on a socket (framing: chunk sizes, transfer codings, duplicated lengths,
oversized headers) or an API body built to cost the server (JSON bombs, huge text, deep nesting).
Every case names the statuses it may get and the time it must take. `HealthWatch` polls /healthz
from another loopback address throughout (nginx's per-client limits never touch it), so a case
that stalls the server shows as a slow /healthz. `slow_clients` and `idle_flood` measure what a
server holds against dribbling and idle connections.

Used by tests/api/test_edge.py against direct Gunicorn and the shipped front (nginx + Gunicorn,
deploy/front/launch.py), and by `python -m vlservice edge` to write docs/bench/edge.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from dataclasses import dataclass, field

WATCH_FROM = "127.0.0.2"  # the health poller's own client address: other cases' limits are per address
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Case:
    name: str
    data: bytes  # sent as it is
    statuses: tuple  # any of these is right
    within_s: float = 1.0  # from the last byte sent to the status line
    code: str | None = None  # the error's `code` in the JSON answer, when the application answers
    front_only: bool = False  # direct Gunicorn cannot hold this (README: it is for trusted networks)


def _post(body: bytes, extra: bytes = b"", path: str = CHAT) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
            % (path.encode(), len(body), extra)) + body


def _chunked(size_line: bytes, data: bytes = b"hi") -> bytes:
    return (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + size_line + b"\r\n" + data + b"\r\n0\r\n\r\n")


def framing_cases() -> list[Case]:
    """Malformed HTTP: every one gets a 4xx at once, in OpenAI's error shape, and the worker goes on."""
    bad = (400,)
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    return [
        Case("chunk size -5", _chunked(b"-5", b"hello"), bad),
        Case("chunk size 0x2", _chunked(b"0x2"), bad),
        Case("chunk size +2", _chunked(b"+2"), bad),
        Case("chunk size ' 2'", _chunked(b" 2"), bad),
        Case("chunk size 2_0", _chunked(b"2_0"), bad),
        # Gunicorn waits for the chunk as for any slow body, holding a thread; nginx refuses it at once
        Case("chunk size of 40 hex digits", _chunked(b"f" * 40), (400, 413), front_only=True),
        Case("transfer-encoding gzip", b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
             b"Transfer-Encoding: gzip\r\n\r\nxx", bad),
        Case("content-length and chunked", b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", bad),
        Case("two content-lengths", b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", bad),
        Case("negative content-length", b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: -1\r\n\r\n", bad),
        Case("content-length of 100 GB", b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: 99999999999\r\n\r\n", (413,)),
        Case("garbage request line", b"GARBAGE\r\n\r\n", bad),
        Case("HTTP/2.0 in a request line", b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", bad),
        Case("a 70 KB header", head + b"X: " + b"a" * 70_000 + b"\r\n\r\n", (400, 431, 494)),
        Case("200 headers", head + b"".join(b"X%d: y\r\n" % i for i in range(200)) + b"\r\n", (400, 431, 494)),
        Case("NUL in a header", head + b"X: a\x00b\r\n\r\n", bad),
        Case("obsolete line folding", head + b"X: a\r\n b\r\n\r\n", bad),
        Case("a 10 KB path", b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", (400, 414)),
    ]


def body_cases(context_tokens: int = 8192) -> list[Case]:
    """Bodies built to cost the server before admission: each is refused by a check that costs
    about its size, within a second of its last byte."""
    text = "The quick brown fox jumps over the lazy dog. " * 200_000  # 9 MB of English
    cjk = "中文的文本没有空格" * 330_000  # 9 MB with no space to cut at
    short = "a" * (context_tokens * 2)

    def chat(content, **extra) -> bytes:
        return json.dumps({"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": content}],
                           **extra}).encode()

    return [
        Case("8 MB array of numbers in an unknown field", chat("Hi", junk=[1] * 4_000_000), (400,), code="invalid_json"),
        Case("100,000 levels of nesting", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", (400,),
             code="invalid_json"),
        Case("9 MB of English text", chat(text), (400,), code="context_length_exceeded"),
        Case("9 MB of Chinese text without spaces", chat(cjk), (400,), code="context_length_exceeded"),
        Case("text of twice the context", chat(short), (400,), code="context_length_exceeded"),
        Case("100,000 messages", json.dumps({"model": "demo", "messages": [{"role": "user", "content": "a"}] * 100_000})
             .encode(), (400,), code="invalid_json"),
        Case("200 KB invalid value", chat("Hi", temperature="x" * 200_000), (400,)),
        Case("not JSON", b"{" * 1000, (400,)),
    ]


def jpeg_scan_bomb(copies: int = 3000, side: int = 4000) -> bytes:
    """A real progressive JPEG (flat grey, `side` square) with its last scan repeated `copies`
    times: under 1 MB, and OpenCV would decode every scan over the whole picture (31 s for 2010)."""
    import cv2
    import numpy as np

    img = np.full((side, side, 3), 128, dtype=np.uint8)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1, cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    data = buf.tobytes()
    last, end = data.rfind(b"\xff\xda"), data.rfind(b"\xff\xd9")
    return data[:end] + data[last:end] * copies + data[end:]


def schema_cases() -> list[Case]:
    """Schemas the grammar compiler cannot serve, or only at a great cost: a 400 naming the field."""
    import base64

    patterns = [{"type": "string", "pattern": "(a|b)*a(a|b){%d}" % k} for k in range(5, 21)]
    schemas = {
        "a $ref cycle in a schema": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                     "$ref": "#/$defs/a"},
        "a pattern of a{4294967295}": {"type": "object", "properties": {"s": {"type": "string",
                                                                             "pattern": "^a{4294967295}$"}}},
        "an allOf of 16 patterns (1 KB)": {"type": "object", "properties": {"s": {"allOf": patterns}}},
    }
    out = [Case(name, _post(json.dumps({"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}],
                                        "response_format": {"type": "json_schema",
                                                            "json_schema": {"name": "x", "schema": schema}}}).encode()),
                (400,), code="invalid_schema") for name, schema in schemas.items()]
    bomb = "data:image/jpeg;base64," + base64.b64encode(jpeg_scan_bomb()).decode()
    out.append(Case("a progressive JPEG of 3000 scans", _post(json.dumps({
        "model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": bomb}}, {"type": "text", "text": "What is it?"}]}]}).encode()),
        (400,), code="invalid_image"))
    return out


def cases(context_tokens: int = 8192) -> list[Case]:
    return framing_cases() + [Case(c.name, _post(c.data), c.statuses, c.within_s, c.code, c.front_only)
                              for c in body_cases(context_tokens)] + schema_cases()


@dataclass
class Answer:
    status: int | None  # None: the server closed or said nothing
    seconds: float  # from the last byte sent to the status line (or to giving up)
    body: bytes = b""


def send(port: int, data: bytes, timeout: float = 15.0, source: str | None = None) -> Answer:
    """Sends `data` whole (from the loopback address `source`, if given), then reads the answer's
    status line and body (as far as Content-Length says, or until the server closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                  source_address=(source, 0) if source else None) as s:
        try:
            s.sendall(data)
        except OSError:  # the server answered and closed while we were still sending (a 413)
            pass
        t = time.perf_counter()
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
                head, sep, body = out.partition(b"\r\n\r\n")
                if sep:
                    length = _content_length(head)
                    if length is not None and len(body) >= length:
                        break
        except OSError:
            pass
        took = time.perf_counter() - t
    if not out.startswith(b"HTTP/1."):
        return Answer(None, took, out)
    return Answer(int(out.split(b" ", 2)[1]), took, out.partition(b"\r\n\r\n")[2])


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None


@dataclass
class HealthWatch:
    """Polls /healthz every `every_s` from `WATCH_FROM` until stopped; `worst` is the slowest answer
    (a failed or non-200 poll counts as `inf`)."""

    port: int
    every_s: float = 0.2
    times: list = field(default_factory=list)
    failures: list = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="health-watch")

    def _run(self) -> None:
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        while not self._stop.is_set():
            t = time.perf_counter()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5,
                                              source_address=(WATCH_FROM, 0)) as s:
                    s.sendall(request)
                    ok = s.recv(64).startswith(b"HTTP/1.1 200")
            except OSError as exc:
                ok = False
                self.failures.append(repr(exc))
            took = time.perf_counter() - t
            self.times.append(took if ok else float("inf"))
            self._stop.wait(self.every_s)

    @property
    def worst(self) -> float:
        return max(self.times, default=0.0)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def slow_clients(port: int, n: int, body_slow: bool, hold_s: float) -> dict:
    """`n` clients that send a request a byte every 0.5 s (the headers, or, with `body_slow`, the
    whole headers then the body) for `hold_s`: how many the server still holds open at the end,
    and how many it closed or answered (with which statuses)."""
    body = json.dumps({"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}).encode()
    data = _post(body)
    head_end = data.index(b"\r\n\r\n") + 4
    socks, sent = [], []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            continue
        s.setblocking(False)
        first = head_end if body_slow else 1
        try:
            s.send(data[:first])
        except OSError:
            pass
        socks.append(s)
        sent.append(first)
    closed, statuses = set(), []
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                got = s.recv(4096)
                closed.add(i)
                if got.startswith(b"HTTP/1."):
                    statuses.append(int(got.split(b" ", 2)[1]))
                continue
            except BlockingIOError:
                pass
            except OSError:
                closed.add(i)
                continue
            if sent[i] < len(data) - 1:  # never the last byte: the request stays incomplete
                try:
                    sent[i] += s.send(data[sent[i]:sent[i] + 1])
                except OSError:
                    closed.add(i)
        time.sleep(0.5)
    for s in socks:
        s.close()
    return {"clients": n, "connected": len(socks), "still_open": len(socks) - len(closed),
            "statuses": sorted(set(statuses))}


def idle_flood(port: int, n: int, hold_s: float) -> dict:
    """`n` connections from one address that send nothing for `hold_s`: how many were accepted and
    still open at the end."""
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            break
    time.sleep(hold_s)
    still = 0
    for s in socks:
        s.setblocking(False)
        try:
            still += s.recv(1) != b""
        except BlockingIOError:
            still += 1
        except OSError:
            pass
        s.close()
    return {"connections": n, "accepted": len(socks), "still_open": still}


class EdgeServer:
    """The demo model served as users start it: `direct` is the README's Gunicorn command,
    `front` the Docker image's command (deploy/front/launch.py: nginx before Gunicorn's socket)."""

    def __init__(self, path: str, log_path, env: dict | None = None):
        import os
        import subprocess
        import sys
        import tempfile

        from .harness import ROOT
        from .services import free_port

        self.path, self.port = path, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {**os.environ, "VL_MODEL": "demo", "HF_HUB_OFFLINE": "1", "VL_WORKERS": "1", **(env or {})}
        if path == "direct":
            full["VL_BIND"] = f"127.0.0.1:{self.port}"
            command = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"]
        else:
            full.update(FRONT_LISTEN=f"127.0.0.1:{self.port}", FRONT_RUN_DIR=tempfile.mkdtemp(prefix="vl-edge-"))
            command = [sys.executable, str(ROOT / "deploy" / "front" / "launch.py")]
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(command, cwd=ROOT, env=full, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self, timeout: float = 300) -> "EdgeServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.path} exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                if send(self.port, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", timeout=3).status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.path} did not become ready:\n{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        self.log.flush()
        return open(self.log_path, errors="replace").read()

    def restarts(self) -> int:
        """Workers booted after the first: each one a worker that died or was killed."""
        return max(0, self.log_text().count("Booting worker") - 1)

    def stop(self) -> None:
        import os
        import signal
        import subprocess

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()

    def __enter__(self):
        return self.wait_ready()

    def __exit__(self, *exc):
        self.stop()


def main(argv: list | None = None) -> int:
    """Runs the table, the slow clients and the idle flood against direct Gunicorn and the front,
    each started as users start it, with the bundled demo model; writes the record."""
    import tempfile
    from pathlib import Path

    from ..obs.records import cpu_info, run_record
    from .harness import ROOT

    ap = argparse.ArgumentParser(prog="python -m vlservice edge", description=main.__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "edge.json")
    ap.add_argument("--hold", type=float, default=40.0, help="seconds the slow and idle clients are held")
    args = ap.parse_args(argv)

    report = {"cpu": cpu_info(2), **run_record(), "paths": {}}
    for path in ("direct", "front"):
        with EdgeServer(path, Path(tempfile.gettempdir()) / f"vlservice-edge-{path}.log") as server:
            with HealthWatch(server.port) as watch:
                table = [{"case": c.name, "status": (a := send(server.port, c.data)).status,
                          "seconds": round(a.seconds, 3), "allowed": list(c.statuses)}
                         for c in cases() if path == "front" or not c.front_only]
                slow_head = slow_clients(server.port, 20, False, args.hold)
                slow_body = slow_clients(server.port, 20, True, args.hold)
                flood = idle_flood(server.port, 1100, args.hold)
            answered = [t for t in watch.times if t != float("inf")]
            report["paths"][path] = {
                "table": table, "slow_headers": slow_head, "slow_bodies": slow_body, "idle_flood": flood,
                "health_polls": len(watch.times), "health_unanswered": len(watch.times) - len(answered),
                "health_over_1s": sum(t >= 1.0 for t in watch.times),
                "health_worst_answered_s": round(max(answered, default=0.0), 3),
                "worker_restarts": server.restarts()}
            print(json.dumps(report["paths"][path], indent=1))
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
