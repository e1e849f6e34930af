"""Cancel a generation when its client goes away (vLLM's `with_cancellation`, for WSGI).

A Gunicorn gthread worker notices a closed connection only when it writes to it: a streamed answer
between two tokens, but a non-streamed one never, since nothing is written until the whole answer
is there; and a stream waiting in the queue or in a long prefill only at its next ping. The model
would go on working for nobody, holding a batch slot that queued requests wait for. So while a
generation runs, a small watcher looks at the client's socket a few times a second and cancels
the generation as soon as the peer has closed it; the scheduler then drops it within a step and
frees its slot.

The socket comes from the WSGI environ (`gunicorn.socket`); where there is none (Flask's test
client, another server) nothing is watched and a generation runs to its end as before.
"""

from __future__ import annotations

import select
import socket
import threading
from contextlib import contextmanager

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


@contextmanager
def cancel_on_disconnect(gen, environ: dict):
    """While the block runs, cancel `gen` if the client of this WSGI request disconnects."""
    sock = environ.get("gunicorn.socket")
    if sock is None:
        yield
        return
    stop = threading.Event()

    def watch():
        while not stop.wait(CHECK_EVERY_S):
            if peer_closed(sock):
                gen.cancel()
                return

    watcher = threading.Thread(target=watch, name=f"watch-{gen.id[-6:]}", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def watch_stream(gen, environ: dict, body):
    """`body`, a streamed answer's chunks, sent under `cancel_on_disconnect`: a stream waiting in
    the queue or in a long prefill writes only a ping every few seconds."""
    with cancel_on_disconnect(gen, environ):
        yield from body
