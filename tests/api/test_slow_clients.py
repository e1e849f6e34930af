"""Slow and stalled clients against Gunicorn as users start it (the demo model): 64 connections
sending their headers or their body a few bytes at a time take no HTTP thread, so /healthz,
/api/stats and a chat completion answer at once meanwhile; a request not whole within
VL_REQUEST_READ_TIMEOUT_S gets a 408 and its connection closes; a pipelined, a chunked and an
`Expect: 100-continue` request are still served."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time

import pytest
import requests

from conftest import ARTIFACTS, wait_until

pytestmark = pytest.mark.server

SLOW = 64
READ_TIMEOUT_S = 6.0


@pytest.fixture(scope="module")
def server(cache_dir):
    from server import ServerProcess

    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VL_MODEL": os.environ.get("VL_TEST_MODEL", "demo"), "VL_CACHE_DIR": str(cache_dir),
           "VL_REQUEST_READ_TIMEOUT_S": str(READ_TIMEOUT_S),  # VL_HTTP_THREADS: the default 16
           "VL_MAX_TOKENS_CAP": "8000"}
    with ServerProcess(env, ARTIFACTS / "server-slow-clients.log") as proc:
        yield proc


BODY = json.dumps({"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}).encode()


def slow_request(i: int) -> bytes:
    """Half of them are slow in their headers, half in their body (headers whole, body trickling)."""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"X-Slow: {i}\r\nContent-Length: {len(BODY)}\r\n\r\n").encode()
    return head + BODY


class SlowClients:
    """`n` sockets held open by one thread that sends each a byte per round (a round every 0.1 s:
    about 10 bytes a second per client, so no request is whole within the test).
    `started` is set once every socket is connected and has sent its first bytes (the body-slow
    half: all their headers)."""

    def __init__(self, url: str, n: int):
        host, port = url.removeprefix("http://").split(":")
        self.addr = (host, int(port))
        self.n = n
        self.started = threading.Event()
        self.stop = threading.Event()
        self.socks: list[socket.socket] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        assert self.started.wait(30), "the slow clients did not connect"
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)
        for s in self.socks:
            s.close()

    def _run(self):
        data = [slow_request(i) for i in range(self.n)]
        sent = []
        for i in range(self.n):
            s = socket.create_connection(self.addr, timeout=10)
            first = data[i].index(b"\r\n\r\n") + 4 if i % 2 else 1
            s.sendall(data[i][:first])
            self.socks.append(s)
            sent.append(first)
        self.started.set()
        while not self.stop.is_set():
            for i, s in enumerate(self.socks):
                if sent[i] < len(data[i]) - 1:  # never the last byte: the request stays unfinished
                    try:
                        s.sendall(data[i][sent[i]:sent[i] + 1])
                    except OSError:
                        continue
                    sent[i] += 1
            self.stop.wait(0.1)  # the pace of a slow client, not a synchronisation


def timed_get(url: str, path: str) -> tuple[int, float]:
    t0 = time.monotonic()
    try:
        code = requests.get(url + path, timeout=30).status_code
    except requests.Timeout:
        code = 0
    return code, time.monotonic() - t0


def test_64_slow_clients_do_not_stall_health_stats_or_a_chat(server):
    with SlowClients(server.url, SLOW) as slow:
        results = [(path, *timed_get(server.url, path)) for path in ("/healthz", "/api/stats", "/healthz")]
        print(f"with {SLOW} slow clients: " + ", ".join(f"{p} {c} in {t:.3f} s" for p, c, t in results))
        t0 = time.monotonic()
        r = requests.post(server.url + "/v1/chat/completions", data=BODY,
                          headers={"Content-Type": "application/json"}, timeout=60)
        chat_s = time.monotonic() - t0
        still_connected = sum(1 for s in slow.socks if _open(s))
    print(f"with {SLOW} slow clients: chat {r.status_code} in {chat_s:.2f} s")
    for path, code, took in results:
        assert code == 200, path
        assert took < 1.0, f"{path} took {took:.2f} s with {SLOW} slow clients"
    assert r.status_code == 200, r.text
    assert chat_s < 20, f"a chat completion took {chat_s:.1f} s with {SLOW} slow clients"
    assert still_connected == SLOW  # they were all there while the others were served


def _open(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


def test_a_request_not_whole_in_time_gets_408_and_is_closed(server):
    for first in (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",  # headers never end
                  slow_request(0)[:-5]):  # body never ends
        with socket.create_connection(("127.0.0.1", server.port), timeout=READ_TIMEOUT_S + 10) as s:
            t0 = time.monotonic()
            s.sendall(first)
            answer = b""
            while chunk := s.recv(65536):  # blocks until the server answers and closes
                answer += chunk
            took = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
        assert READ_TIMEOUT_S - 0.5 < took < READ_TIMEOUT_S + 3, took


def _exchange(server, data: bytes, responses: int) -> list[bytes]:
    """Send `data` on one connection, read `responses` whole HTTP responses (Content-Length framed)."""
    out = []
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        s.sendall(data)
        buf = b""
        while len(out) < responses:
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(65536)
                assert chunk, f"connection closed after {len(out)} responses: {buf[:300]!r}"
                buf += chunk
            head, buf = buf.split(b"\r\n\r\n", 1)
            if head.startswith(b"HTTP/1.1 100 "):
                continue
            length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(buf) < length:
                chunk = s.recv(65536)
                assert chunk
                buf += chunk
            out.append(head + b"\r\n\r\n" + buf[:length])
            buf = buf[length:]
    return out


def test_pipelined_chunked_and_expect_continue_requests_are_served(server):
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    answers = _exchange(server, get + get + slow_request(1), 3)  # three requests in one write
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers), [a[:100] for a in answers]
    assert b'"choices"' in answers[2]

    chunked = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % 10 + BODY[:10] + b"\r\n"
               + b"%x\r\n" % (len(BODY) - 10) + BODY[10:] + b"\r\n0\r\n\r\n")
    (answer,) = _exchange(server, chunked, 1)
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"choices"' in answer, answer[:300]

    # curl's way with a large body: headers first, the body only after "100 Continue"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(slow_request(2).replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n", 1).split(b"\r\n\r\n")[0]
                  + b"\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n")
        s.sendall(BODY)
        answer = b""
        while b'"choices"' not in answer and (chunk := s.recv(65536)):
            answer += chunk
    assert b"HTTP/1.1 200 " in answer, answer[:300]


def test_a_client_that_goes_away_is_still_noticed_through_the_read_ahead_socket(server):
    """The disconnect watcher peeks at the socket the thread got (the read-ahead wrapper): a JSON
    request whose client leaves is cancelled, as with stock gthread (tests/api/test_disconnect.py)."""
    def stats():
        return requests.get(server.url + "/api/stats", timeout=10).json()

    before = stats()["counters"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "demo", "messages": [{"role": "user", "content": "Tell a very long story."}],
         "max_tokens": 8000, "min_tokens": 8000, "result_cache": False}), {"Content-Type": "application/json"})
    wait_until(lambda: stats()["busy"], "the model working on the request", timeout=15)
    conn.close()
    def cancelled_and_free():
        now = stats()
        return now["counters"] if not now["busy"] and now["counters"]["cancelled"] > before["cancelled"] else None

    after = wait_until(cancelled_and_free, "the generation cancelled and the model free", timeout=15)
    assert after["completed"] == before["completed"]
