"""The soak's numbers come from the standard library (`statistics`): percentiles linear between the
closest ranks, and the least-squares slope of RSS over time that decides its memory verdict."""

from __future__ import annotations

import socket

import pytest

from vlservice.tools.soak import ConnectionFailed, Http, percentile, slope_per_minute


@pytest.mark.parametrize("values, q, expected", [
    ([], 50, None),
    ([7.25], 95, 7.2),  # one value: that value (rounded half to even)
    ([1, 2, 3, 4], 50, 2.5),
    (list(range(101)), 95, 95.0),
    ([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100], 95, 95.0),  # between the two highest ranks
    ([10, 20], 95, 19.5),
    ([5, 1, 4, 2, 3], 50, 3.0),  # order does not matter
])
def test_percentile(values, q, expected):
    assert percentile(values, q) == expected


def test_slope_is_per_minute_and_needs_two_distinct_times():
    growing = [(t, 100 + 2.0 * t / 60) for t in range(0, 600, 30)]  # 2 MB per minute
    assert slope_per_minute(growing) == pytest.approx(2.0)
    noisy = [(t, 100 + (3 if i % 2 else -3)) for i, t in enumerate(range(0, 600, 30))]
    assert abs(slope_per_minute(noisy)) < 0.2
    assert slope_per_minute([]) is None and slope_per_minute([(5, 1.0)]) is None
    assert slope_per_minute([(5, 1.0), (5, 9.0)]) is None


def test_no_server_is_a_connection_failure():
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    http = Http(f"http://127.0.0.1:{port}")
    with pytest.raises(ConnectionFailed, match="ConnectionError"):
        http.get_json("/api/stats")
    http.close()


def test_a_get_whose_connection_the_server_dropped_is_sent_again():
    """A kept-alive connection the server closes as a request goes out fails without the server
    seeing it; the soak's GETs (stats samples) are sent once more instead of counted as failures."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(2)
    port = listener.getsockname()[1]
    seen = []

    def serve():
        for n in range(2):
            conn, _ = listener.accept()
            with conn:
                seen.append(conn.recv(65536).split(b"\r\n", 1)[0])
                if n == 1:  # the first connection is closed unanswered
                    body = b'{"ok": true}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    http = Http(f"http://127.0.0.1:{port}")
    try:
        assert http.get_json("/api/stats") == {"ok": True}
    finally:
        http.close()
        t.join(5)
        listener.close()
    assert seen == [b"GET /api/stats HTTP/1.1"] * 2
