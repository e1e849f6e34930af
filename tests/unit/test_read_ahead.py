"""The read-ahead worker's pieces without a server: where a request ends (Content-Length, chunked,
none, too large, endless headers), and the socket wrapper that serves the bytes read ahead first
while a peek (the disconnect watcher's) still sees the socket itself."""

from __future__ import annotations

import socket

import pytest

from vlservice.http.worker import MAX_HEAD, BufferedSocket, _Chunked, _Reading

MAX_BODY = 1000


def fed(pieces: list[bytes]) -> tuple[_Reading, list]:
    state, replies = _Reading(deadline=0.0), []
    for piece in pieces:
        assert not state.complete, "fed past the end"
        replies.append(state.feed(piece, MAX_BODY))
    return state, replies


def one_by_one(data: bytes) -> list[bytes]:
    return [data[i:i + 1] for i in range(len(data))]


@pytest.mark.parametrize("split", [lambda d: [d], one_by_one])
def test_content_length_ends_the_request_at_its_last_byte(split):
    request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    state, _ = fed(split(request[:-1]))
    assert not state.complete
    state.feed(b"o", MAX_BODY)
    assert state.complete
    state.spool.seek(0)
    assert state.spool.read() == request


@pytest.mark.parametrize("split", [lambda d: [d], one_by_one])
def test_a_chunked_body_ends_after_its_last_chunk_and_trailers(split):
    body = b"5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n"
    request = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    state, _ = fed(split(request[:-1]))
    assert not state.complete
    state.feed(b"\n", MAX_BODY)
    assert state.complete


def test_no_body_a_too_large_body_and_endless_headers_are_handed_over_at_once():
    assert fed([b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"])[0].complete
    assert fed([b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1)])[0].complete  # 413 there
    state, _ = fed([b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HEAD // 6)])
    assert state.complete  # Gunicorn's parser refuses it
    bad = _Chunked()  # a malformed size ends the scan
    bad.feed(b"zz\r\n")
    assert bad.done


def test_expect_100_continue_is_answered_once_the_headers_are_in():
    state, replies = fed([b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"])
    assert replies == [b"HTTP/1.1 100 Continue\r\n\r\n"] and not state.complete
    state, replies = fed([b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"])
    assert replies == [None] and state.complete  # the body is already here: nothing to ask for


def test_the_socket_wrapper_serves_read_ahead_bytes_first_and_peeks_at_the_socket():
    a, b = socket.socketpair()
    with a, b:
        wrapped = BufferedSocket(a, timeout_s=5.0)
        wrapped.give(b"ahead")
        b.sendall(b"later")
        assert wrapped.recv(1, socket.MSG_PEEK) == b"l"  # a peek does not consume the bytes ahead
        assert wrapped.recv(3) == b"ahe" and wrapped.recv(100) == b"ad"
        assert wrapped.recv(100) == b"later"
        wrapped.setblocking(True)
        assert a.gettimeout() == 5.0  # "blocking" in a thread is bounded
        wrapped.setblocking(False)
        assert a.gettimeout() == 0.0
        wrapped.give(b"next request")
        assert wrapped.take() == b"next request" and wrapped.take() == b""
