"""The Docker image's front, started on this host exactly as the image starts it
(`tini -- python deploy/front/launch.py`: Debian's nginx before Gunicorn on a unix socket, the demo
model): it serves, answers its own refusals in OpenAI's error JSON, holds the edge's limits
(malformed chunked bodies, the body limit, slow headers, connections per address), and the
container's lifetime follows both processes (either ending ends it; SIGTERM drains Gunicorn)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time

import pytest
import requests

from conftest import ARTIFACTS, ROOT, wait_until
from front import FrontProcess, exchange

pytestmark = pytest.mark.slow

EDGE = (ROOT / "deploy" / "nginx" / "edge" / "server.conf").read_text()
HEADER_TIMEOUT = int(re.search(r"^client_header_timeout (\d+)s;", EDGE, re.M).group(1))
LIMIT_CONN = int(re.search(r"^limit_conn vl_conn (\d+);", EDGE, re.M).group(1))
CHAT = "/v1/chat/completions"


def front_env(cache_dir) -> dict:
    return {"VL_MODEL": os.environ.get("VL_TEST_MODEL", "demo"), "VL_CACHE_DIR": str(cache_dir),
            "VL_QUEUE_SIZE": "4", "VL_MAX_TOKENS_CAP": "512",
            "VL_GRACEFUL_TIMEOUT": "120"}  # the drain test's stream finishes however slow the machine is


@pytest.fixture(scope="module")
def front(cache_dir):
    ARTIFACTS.mkdir(exist_ok=True)
    proc = FrontProcess(front_env(cache_dir), ARTIFACTS / "front.log").start()
    yield proc
    proc.stop()


def chat(url: str, **body) -> requests.Response:
    payload = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, **body}
    return requests.post(url + CHAT, json=payload, timeout=120, stream=bool(body.get("stream")))


def openai_error(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err


def head(path: str = CHAT, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: vl\r\nContent-Type: application/json\r\n{extra}".encode()


def test_ready_answers_and_streams_through_nginx(front):
    r = requests.get(front.url + "/readyz", timeout=5)
    assert r.status_code == 200 and r.headers["Server"] == "nginx"
    answer = chat(front.url)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["role"] == "assistant"
    stream = chat(front.url, stream=True, max_tokens=8)
    assert stream.headers["Content-Type"].startswith("text/event-stream")
    assert [line for line in stream.iter_lines(decode_unicode=True) if line][-1] == "data: [DONE]"
    assert requests.get(front.url + "/healthz", timeout=5).status_code == 200
    assert front.socket.is_socket()  # Gunicorn listens on the unix socket only


@pytest.mark.parametrize("size", [b"-5", b"0x2"])
def test_a_malformed_chunk_size_gets_400_at_once_and_the_server_keeps_serving(front, size):
    status, _, body, seconds = exchange(front.port, head(extra="Transfer-Encoding: chunked\r\n\r\n")
                                        + size + b"\r\nab\r\n0\r\n\r\n", timeout=5)
    assert status == 400 and seconds < 1.0, (status, seconds)
    assert openai_error(body)["code"] == "bad_request"
    assert chat(front.url).status_code == 200


def test_a_body_over_the_limit_gets_413_in_json(front):
    from vlservice.config import Settings

    limit = Settings().max_request_bytes
    status, head_text, body, seconds = exchange(front.port, head(extra=f"Content-Length: {limit + 1}\r\n\r\n"))
    assert status == 413 and seconds < 1.0 and "application/json" in head_text
    assert openai_error(body)["code"] == "request_too_large"
    # A chunk that says it is larger than what is left is refused when it starts, before it is read.
    status, _, body, _ = exchange(front.port, head(extra="Transfer-Encoding: chunked\r\n\r\n")
                                  + f"{limit + 1:x}\r\n".encode() + b"x")
    assert status == 413 and openai_error(body)["code"] == "request_too_large"


def test_a_chunked_body_is_cut_at_the_limit(front):
    """1 MiB chunks, reading whenever an answer is there (as a client that waits for one does),
    until it comes: a 413 once nginx has read the limit. Its log says what it had and what the
    refused chunk declared; whatever else the client got into the socket sat in the kernel's
    buffers, and what it sends after the 413 is read and dropped (lingering_time), never stored."""
    import select

    from vlservice.config import Settings

    limit = Settings().max_request_bytes
    chunk = memoryview(b"100000\r\n" + b"x" * 0x100000 + b"\r\n")
    sent, answer, pending = 0, b"", chunk[:0]
    with socket.create_connection(("127.0.0.1", front.port), timeout=30) as s:
        s.sendall(head(extra="Transfer-Encoding: chunked\r\n\r\n"))
        s.setblocking(False)
        while b"\r\n\r\n" not in answer and sent < 2 * limit:
            readable, writable, _ = select.select([s], [s], [], 10)
            assert readable or writable, "nginx neither read nor answered for 10 s"
            if readable:
                got = s.recv(65536)
                if not got:
                    break
                answer += got
            elif writable:
                pending = pending or chunk
                n = s.send(pending)
                sent, pending = sent + n, pending[n:]
    assert answer.startswith(b"HTTP/1.1 413"), (sent, answer[:200])
    assert openai_error(answer.partition(b"\r\n\r\n")[2].split(b"\n")[0])["code"] == "request_too_large"
    had, declared = map(int, wait_until(
        lambda: re.search(r"too large chunked body: (\d+)\+(\d+) bytes", front.log_text()),
        "nginx logging the refused chunk").groups())
    assert had <= limit < had + declared
    assert limit < sent < 2 * limit  # the rest of what was sent: socket buffers, not nginx


def test_a_slowloris_header_is_cut_by_the_header_timeout(front):
    """A byte of the head every 0.5 s: nginx's header timer is not renewed by each byte, so the
    connection ends client_header_timeout after it opened, however steadily it dribbles."""
    data = head(path="/healthz") + b"X-Slow: " + b"a" * 10_000
    started = time.monotonic()
    closed_after = None
    with socket.create_connection(("127.0.0.1", front.port), timeout=0.5) as s:
        for i in range(len(data)):
            try:
                s.sendall(data[i:i + 1])
                if s.recv(4096) == b"":  # nothing to read within 0.5 s raises; closed reads b""
                    closed_after = time.monotonic() - started
                    break
            except socket.timeout:
                pass
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            if time.monotonic() - started > HEADER_TIMEOUT + 10:
                break
    assert closed_after is not None, "a header dribble outlived the header timeout by 10 s"
    assert HEADER_TIMEOUT - 1 <= closed_after <= HEADER_TIMEOUT + 3, closed_after
    assert requests.get(front.url + "/healthz", timeout=5).status_code == 200


def test_limit_conn_refuses_one_connection_too_many_from_an_address(front):
    """Requests whose bodies are still on their way count against the address's limit_conn (nginx
    is reading them; Gunicorn has seen nothing); one more gets 429 in OpenAI's JSON, and a slot
    that frees lets requests through again."""
    held = []
    try:
        for _ in range(LIMIT_CONN):
            s = socket.create_connection(("127.0.0.1", front.port), timeout=5)
            s.sendall(head(extra="Content-Length: 100\r\n\r\n") + b"{")
            held.append(s)

        def refused():
            status, head_text, body, _ = exchange(front.port, b"GET /healthz HTTP/1.1\r\nHost: vl\r\n\r\n")
            return (status, head_text, body) if status == 429 else None

        status, head_text, body = wait_until(refused, f"the connection after {LIMIT_CONN} refused", timeout=10)
        assert "Retry-After: 1" in head_text and "application/json" in head_text
        assert openai_error(body)["code"] == "rate_limited"
        held.pop().close()
        wait_until(lambda: exchange(front.port, b"GET /healthz HTTP/1.1\r\nHost: vl\r\n\r\n")[0] == 200,
                   "a request through once a slot is free", timeout=10)
    finally:
        for s in held:
            s.close()
    wait_until(lambda: chat(front.url).status_code == 200, "chat answered again", timeout=30)


def test_sigterm_drains_gunicorn_behind_nginx_then_the_launcher_exits(front):
    """Last: it stops the module's front. A running stream finishes whole while new requests get a
    503 with Retry-After; then both processes stop and the launcher exits 0. (Gunicorn's master
    unlinks its unix socket when SIGTERM comes, so new requests meet nginx's 503 `not_ready`
    rather than the worker's `draining`; the worker finishes what it runs either way.)"""
    stream = chat(front.url, stream=True, max_tokens=256, min_tokens=256, result_cache=False)
    lines = stream.iter_lines(decode_unicode=True)
    for line in lines:
        if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
            break  # the answer is streaming
    front.proc.send_signal(signal.SIGTERM)  # to tini, as `docker stop` does; it passes it on

    def refused():
        r = requests.get(front.url + "/readyz", timeout=5)
        return [r] if r.status_code == 503 else None  # (a Response is false when not ok)

    # polled slower than limit_req's rate (10/s), so that what it sees is the drain, not the limit
    (r,) = wait_until(refused, "new requests refused while Gunicorn drains", timeout=20, interval=0.3)
    assert openai_error(r.content)["code"] in ("draining", "not_ready") and int(r.headers["Retry-After"]) >= 1
    rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    final = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert [c["choices"][0]["finish_reason"] for c in final if c["choices"]][-1] == "length"
    assert front.proc.wait(150) == 0
    assert "gunicorn exited with 0 after SIGTERM" in front.log_text()


@pytest.mark.parametrize("victim", ["nginx", "gunicorn"])
def test_either_process_ending_ends_the_container(cache_dir, victim):
    proc = FrontProcess(front_env(cache_dir), ARTIFACTS / f"front-{victim}-killed.log").start()
    try:
        other = proc.gunicorn_pid() if victim == "nginx" else proc.nginx_pid()
        os.kill(proc.nginx_pid() if victim == "nginx" else proc.gunicorn_pid(), signal.SIGKILL)
        code = proc.proc.wait(60)
        assert code != 0
        assert f"{victim} exited with -9" in proc.log_text()
        wait_until(lambda: not os.path.exists(f"/proc/{other}") or _zombie(other),
                   f"the other process ({other}) stopped too", timeout=30)
    finally:
        proc.stop()


def _zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
