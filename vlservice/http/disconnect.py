"""Cancel a generation when its client goes away (vLLM's `with_cancellation`, for WSGI).

A Gunicorn gthread worker notices a closed connection only when it writes to it: a streamed answer
between two tokens, but a non-streamed one never, since nothing is written until the whole answer
is there; and a stream waiting in the queue or in a long prefill only at its next ping. The model
would go on working for nobody, holding a batch slot that queued requests wait for. So while a
generation runs, the worker's one watcher thread looks at the client's socket a few times a second
and cancels the generation as soon as the peer has closed it; the scheduler then drops it within a
step and frees its slot.

The socket comes from the WSGI environ (`gunicorn.socket`); where there is none (Flask's test
client, another server) nothing is watched and a generation runs to its end as before.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import threading
from contextlib import contextmanager
from typing import Protocol

CHECK_EVERY_S = 0.2  # how often the watcher looks: the slot is free again within about this long


def peer_closed(sock: socket.socket) -> bool:
    """True when the client closed (or reset) the connection: the socket reads as end-of-file.
    Only peeks, so nothing the server would read is consumed. A client that only half-closes
    (shuts down its writing side and still waits for the answer) looks gone too; HTTP clients do
    not do that."""
    try:
        poll = select.poll()  # not select(): no limit on the descriptor's number
        poll.register(sock, select.POLLIN)
        if not poll.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except ValueError:  # a TLS socket cannot peek, a closed one has no descriptor: do not guess
        return False
    except OSError:  # reset by the peer
        return True


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Watcher:
    """One thread per process that looks at every watched client socket a few times a second
    (a thread per request, two per chat completion, came and went some 60 times a second under
    load: each new thread a stack, a Python thread state and an allocator's thread cache, and with
    glibc's malloc a new arena's worth of memory that freed blocks scattered over; issue 45). It
    starts with the first watch in a process (a Gunicorn worker, after the fork) and sleeps while
    nothing is watched."""

    def __init__(self, every_s: float = CHECK_EVERY_S):
        self.every_s = every_s
        self._cond = threading.Condition()
        self._watched: dict[int, tuple[socket.socket, Cancellable]] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def add(self, sock: socket.socket, target: Cancellable) -> int:
        """Watch `sock`; call `target.cancel()` (once) when its peer has closed it. Returns the
        key to `remove` it with."""
        with self._cond:
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                self._pid = os.getpid()  # a forked worker starts its own (threads do not survive a fork)
                self._thread = threading.Thread(target=self._run, name="vlservice-disconnects", daemon=True)
                self._thread.start()
            key = next(self._keys)
            self._watched[key] = (sock, target)
            self._cond.notify()
            return key

    def remove(self, key: int) -> None:
        with self._cond:
            self._watched.pop(key, None)

    def watching(self) -> int:
        with self._cond:
            return len(self._watched)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._watched:
                    self._cond.wait()
                self._cond.wait(self.every_s)  # woken early by a new watch: look at it a little sooner
                items = list(self._watched.items())
            for key, (sock, target) in items:
                if peer_closed(sock):
                    with self._cond:
                        gone = self._watched.pop(key, None) is not None  # not removed meanwhile
                    if gone:
                        target.cancel()


WATCHER = Watcher()


@contextmanager
def cancel_on_disconnect(gen, environ: dict):
    """While the block runs, cancel `gen` if the client of this WSGI request disconnects."""
    sock = environ.get("gunicorn.socket")
    if sock is None:
        yield
        return
    key = WATCHER.add(sock, gen)
    try:
        yield
    finally:
        WATCHER.remove(key)


def watch_stream(gen, environ: dict, body):
    """`body`, a streamed answer's chunks, sent under `cancel_on_disconnect`: a stream waiting in
    the queue or in a long prefill writes only a ping every few seconds."""
    with cancel_on_disconnect(gen, environ):
        yield from body
