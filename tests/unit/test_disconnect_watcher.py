"""The worker's one disconnect watcher (vlservice/http/disconnect.py): a request's client socket is
watched by a single thread per process, not a thread per request (issue 45: two threads came and
went per chat completion, some 60 a second under load)."""

from __future__ import annotations

import socket
import threading

from vlservice.http.disconnect import Watcher, cancel_on_disconnect


class Target:
    def __init__(self):
        self.cancelled = threading.Event()
        self.calls = 0

    def cancel(self):
        self.calls += 1
        self.cancelled.set()


def test_a_closed_peer_cancels_its_target_once_and_an_open_one_is_left_alone():
    w = Watcher(every_s=0.02)
    server_a, client_a = socket.socketpair()
    server_b, client_b = socket.socketpair()
    gone, staying = Target(), Target()
    w.add(server_a, gone)
    w.add(server_b, staying)
    client_a.close()
    assert gone.cancelled.wait(5)
    assert w.watching() == 1  # the cancelled one is no longer watched
    assert not staying.cancelled.wait(0.2) and gone.calls == 1
    for s in (server_a, server_b, client_b):
        s.close()


def test_a_watch_removed_before_its_peer_closes_never_cancels():
    w = Watcher(every_s=0.02)
    server, client = socket.socketpair()
    t = Target()
    key = w.add(server, t)
    w.remove(key)
    client.close()
    assert not t.cancelled.wait(0.3)
    server.close()


def test_many_requests_share_one_thread():
    before = threading.active_count()
    w = Watcher(every_s=0.02)
    pairs = [socket.socketpair() for _ in range(50)]
    targets = [Target() for _ in pairs]
    keys = [w.add(server, t) for (server, _), t in zip(pairs, targets)]
    assert threading.active_count() == before + 1
    for _, client in pairs[:25]:
        client.close()
    assert all(t.cancelled.wait(5) for t in targets[:25])
    assert not any(t.cancelled.is_set() for t in targets[25:])
    for key in keys:
        w.remove(key)
    assert w.watching() == 0 and threading.active_count() == before + 1
    for server, client in pairs:
        server.close()
        client.close()


def test_the_block_watches_the_wsgi_socket_while_it_runs():
    from vlservice.http import disconnect

    server, client = socket.socketpair()
    t = Target()
    with cancel_on_disconnect(t, {"gunicorn.socket": server}):
        assert disconnect.WATCHER.watching() >= 1
        client.close()
        assert t.cancelled.wait(5)
    with cancel_on_disconnect(t, {}):  # no socket (Flask's test client): nothing watched
        pass
    server.close()
