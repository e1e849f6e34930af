"""`ReadAheadWorker`: Gunicorn's gthread worker, but a request reaches a thread only once it has
arrived whole, so slow or stalled clients cannot take the threads.

Stock gthread hands a connection to a thread as soon as its first byte arrives, and the thread
then blocks reading the headers and the body: 16 clients sending a byte a second hold all 16
threads, and /healthz, /api/stats and every other request wait behind them. Here the worker's main
loop (one selector, no threads) reads each request without blocking, the way nginx buffers one:
the headers up to their blank line, then the body as `Content-Length` or the chunked framing says
(headers and the first MiB in memory, the rest in a temporary file); only then is the connection
queued for a thread, whose parser reads the buffered bytes as if from the socket. A request not
whole within `VL_REQUEST_READ_TIMEOUT_S` of its first byte gets a 408 and the connection closes;
a slow client costs a file descriptor and its buffered bytes, never a thread.

What it does not do: bound how fast a client reads the answer (a thread writes it; a send that
makes no progress for `VL_REQUEST_READ_TIMEOUT_S` fails and the thread moves on), nor cap the
number of connections below Gunicorn's `worker_connections` (1000 per worker), nor read a large
upload over a slow link (a 64 MiB body must arrive within the deadline). A reverse proxy that
buffers requests (the shipped nginx template) covers those.

Headers and framing are only looked at here to find where the request ends; Gunicorn's own parser
still parses and validates everything (a malformed request is handed over as it is, and refused
there). `Expect: 100-continue` is answered here (the client would otherwise wait before sending
the body that the thread is waiting for); Gunicorn may answer it a second time, which HTTP allows.
"""

from __future__ import annotations

import errno
import io
import re
import selectors
import tempfile
import time
from functools import partial

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from ..config import Settings

MAX_HEAD = 64 * 1024  # headers longer than this are handed to Gunicorn's parser, which refuses them
SPOOL_BYTES = 1024 * 1024  # a request's bytes beyond this wait in a temporary file, not in memory
_CL = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*(\d+)[ \t]*(?=\r\n)", re.I)
_TE = re.compile(rb"\r\ntransfer-encoding[ \t]*:", re.I)
_EXPECT = re.compile(rb"\r\nexpect[ \t]*:[ \t]*100-continue[ \t]*(?=\r\n)", re.I)
_BODY_408 = (b'{"error": {"message": "the request did not arrive in time", "type": "invalid_request_error", '
             b'"param": null, "code": "request_timeout"}}')
RESPONSE_408 = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n" % len(_BODY_408)) + _BODY_408


class BufferedSocket:
    """The client socket, with bytes already read served first. Everything else is the socket's;
    blocking mode means a timeout of `timeout_s` per operation, so a thread never waits forever."""

    def __init__(self, sock, timeout_s: float):
        self._sock = sock
        self._timeout_s = timeout_s or None
        self._ahead: io.IOBase | None = None

    def give(self, data) -> None:
        """Bytes to serve before the socket's (a file positioned at its start, or bytes)."""
        self._ahead = data if hasattr(data, "read") else io.BytesIO(data)

    def take(self) -> bytes:
        """The buffered bytes not read yet (removed)."""
        if self._ahead is None:
            return b""
        rest = self._ahead.read()
        self._drop()
        return rest

    def _drop(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def recv(self, size: int, *flags) -> bytes:
        if self._ahead is not None and not flags:  # flags (a MSG_PEEK) go to the socket itself
            data = self._ahead.read(size)
            if data:
                return data
            self._drop()
        return self._sock.recv(size, *flags)

    def setblocking(self, flag: bool) -> None:
        self._sock.settimeout(self._timeout_s if flag else 0.0)

    def close(self) -> None:
        self._drop()
        self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    def __getattr__(self, name):
        return getattr(self._sock, name)


class _Chunked:
    """Where a chunked body ends, fed its bytes as they come (the sizes only; no validation)."""

    def __init__(self):
        self.line = bytearray()
        self.skip = 0  # data bytes (and their CRLF) still to pass
        self.last = False  # the zero-size chunk was seen: trailer lines until an empty one
        self.done = False

    def feed(self, data: bytes) -> int:
        """How many bytes of `data` belong to the body; `done` once it ended (or is malformed)."""
        i = 0
        while i < len(data) and not self.done:
            if self.skip:
                step = min(self.skip, len(data) - i)
                self.skip -= step
                i += step
                continue
            nl = data.find(b"\n", i)
            if nl < 0:
                self.line += data[i:]
                if len(self.line) > MAX_HEAD:
                    self.done = True  # malformed: Gunicorn's parser will say so
                return len(data)
            self.line += data[i:nl]
            i = nl + 1
            line, self.line = bytes(self.line).rstrip(b"\r"), bytearray()
            if self.last:
                self.done = not line
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.done = True
                continue
            if size == 0:
                self.last = True
            else:
                self.skip = size + 2
        return i


class _Reading:
    """One request being read by the main loop."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
        self.head = bytearray()
        self.body_left: int | None = None  # Content-Length bytes still to come
        self.chunked: _Chunked | None = None
        self.complete = False
        self.got = 0

    def feed(self, data: bytes, max_body: int) -> bytes | None:
        """Take bytes; once the request is whole, `complete` (the reply to send first, if any)."""
        self.spool.write(data)
        self.got += len(data)
        if self.body_left is None and self.chunked is None:
            start = max(0, len(self.head) - 3)
            self.head += data
            end = self.head.find(b"\r\n\r\n", start)
            if end < 0:
                self.complete = len(self.head) > MAX_HEAD
                return None
            head, rest = bytes(self.head[:end + 2]), bytes(self.head[end + 4:])
            self.head = bytearray()
            length = _CL.search(head)
            if _TE.search(head):
                self.chunked = _Chunked()
                self.chunked.feed(rest)
                self.complete = self.chunked.done
            elif length and int(length.group(1)) <= max_body:
                self.body_left = int(length.group(1)) - len(rest)
                self.complete = self.body_left <= 0
            else:  # no body, or one too large: the application answers (413) without reading it
                self.complete = True
            if not self.complete and _EXPECT.search(head):
                return b"HTTP/1.1 100 Continue\r\n\r\n"
            return None
        if self.chunked is not None:
            self.chunked.feed(data)
            self.complete = self.chunked.done
        else:
            assert self.body_left is not None
            self.body_left -= len(data)
            self.complete = self.body_left <= 0
        return None


class ReadAheadWorker(ThreadWorker):
    def init_process(self):
        settings = Settings.from_env()
        self.read_timeout_s = settings.request_read_timeout_s
        self.max_body = settings.max_request_bytes
        self.reading: dict = {}  # conn -> _Reading, in the order they started
        super().init_process()

    # --------------------------------------------------------------- connections into reading
    def accept(self, listener):
        try:
            client, addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        from gunicorn.workers.gthread import TConn

        conn = TConn(self.cfg, BufferedSocket(client, self.read_timeout_s), addr, listener.getsockname())
        self._start_reading(conn)

    def on_client_socket_readable(self, conn, client):
        """A kept-alive connection's next request: read it here too."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._start_reading(conn)

    def _start_reading(self, conn, seed: bytes = b"") -> None:
        conn.sock.setblocking(False)
        state = _Reading(time.monotonic() + (self.read_timeout_s or float("inf")))
        self.reading[conn] = state
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))
        if seed:  # bytes a previous request's read brought along (a pipelined request)
            self._take(conn, state, seed)

    def _on_readable(self, conn, _sock) -> None:
        state = self.reading.get(conn)
        if state is None:
            return
        while not state.complete:
            try:
                data = conn.sock._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:  # the client left (or broke off) before its request was whole
                self._drop(conn, reply=None)
                return
            if not self._take(conn, state, data):
                return

    def _take(self, conn, state: _Reading, data: bytes) -> bool:
        reply = state.feed(data, self.max_body)
        if reply:
            try:
                conn.sock._sock.send(reply)
            except OSError:
                pass
        if not state.complete:
            return True
        del self.reading[conn]
        self.poller.unregister(conn.sock)
        state.spool.seek(0)
        conn.sock.give(state.spool)
        conn.data_ready = True  # stock gthread must not wait for data: it is all here
        self.enqueue_req(conn)
        return False

    def _drop(self, conn, reply: bytes | None) -> None:
        state = self.reading.pop(conn)
        state.spool.close()
        try:
            self.poller.unregister(conn.sock)
        except (OSError, KeyError, ValueError):
            pass
        if reply:
            try:
                conn.sock._sock.send(reply)
            except OSError:
                pass
        self.nr_conns -= 1
        util.close(conn.sock)

    def murder_pending(self):
        super().murder_pending()
        now = time.monotonic()
        for conn, state in list(self.reading.items()):
            if state.deadline <= now:
                self._drop(conn, reply=RESPONSE_408 if state.got else None)
            elif not self.alive and not state.got:
                self._drop(conn, reply=None)  # stopping: an idle new connection is not waited for

    # --------------------------------------------------------------- back from a thread
    def finish_request(self, conn, fs):
        keep = not fs.cancelled() and fs.exception() is None and fs.result() is True
        ahead = conn.sock.take() if keep and self.alive else b""
        if ahead:  # the next request's bytes came with this one's: read it on from there
            self._start_reading(conn, seed=ahead)
            return
        super().finish_request(conn, fs)
