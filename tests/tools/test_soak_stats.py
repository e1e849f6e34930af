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


# --------------------------------------------------------------------------- the memory verdict
# RSS less the caches' own accounted bytes, fitted after the warm-up: caches filling their budgets
# pass, a leak beside them fails.

from vlservice.tools.soak import memory_row, memory_verdict, worker_balances  # noqa: E402


def series(minutes: float, cache_mb_per_min: float, leak_mb_per_min: float, pid: int = 7, t0: float = 0.0,
           every_s: float = 10.0, base: float = 500.0) -> list:
    """Samples every `every_s` s: the caches grow by `cache_mb_per_min`, RSS by that plus the leak."""
    rows = []
    for i in range(int(minutes * 60 / every_s) + 1):
        t = t0 + i * every_s
        caches = cache_mb_per_min * (t - t0) / 60.0
        rows.append({"t": t, "pid": pid, "rss_mb": base + caches + leak_mb_per_min * (t - t0) / 60.0,
                     "caches_mb": caches, "queue_depth": 0})
    return rows


def test_rss_growing_exactly_as_the_caches_do_passes():
    v = memory_verdict(series(10, cache_mb_per_min=148.0, leak_mb_per_min=0.0), threshold=2.0)
    seg = v["main"]
    assert v["judged"] and v["failures"] == []
    assert seg["rss_slope"] == pytest.approx(148.0) and seg["caches_slope"] == pytest.approx(148.0)
    assert seg["unexplained_slope"] == pytest.approx(0.0, abs=1e-6)


def test_a_leak_on_top_of_the_caches_fails():
    v = memory_verdict(series(10, cache_mb_per_min=148.0, leak_mb_per_min=3.0), threshold=2.0)
    assert v["judged"] and v["main"]["unexplained_slope"] == pytest.approx(3.0)
    assert len(v["failures"]) == 1 and "3.00 MB/min" in v["failures"][0] and "worker 7" in v["failures"][0]
    # under the threshold: passes
    assert memory_verdict(series(10, 50.0, 1.5), threshold=2.0)["failures"] == []


def test_the_warm_up_is_left_out_and_a_short_run_is_not_judged():
    # a steep first minute (allocator arenas, first requests), then flat: judged flat
    rows = series(1, cache_mb_per_min=0.0, leak_mb_per_min=300.0) + series(
        5, 0.0, 0.0, t0=70.0, base=800.0)[:]
    v = memory_verdict(rows, threshold=2.0, warmup_s=60.0)
    assert v["judged"] and v["failures"] == [] and abs(v["main"]["unexplained_slope"]) < 1e-6
    short = memory_verdict(series(1.2, 0.0, 100.0), threshold=2.0, warmup_s=60.0)
    assert not short["judged"] and short["failures"] == []
    assert short["main"]["fit"].startswith("all samples")


def test_each_worker_is_its_own_segment():
    """A rolling restart: the new worker starts small with empty caches; the drop is no trend, and
    each worker is judged alone."""
    old = series(6, 40.0, 0.0, pid=1, base=900.0)
    new = series(4, 40.0, 5.0, pid=2, t0=old[-1]["t"] + 10, base=450.0)
    v = memory_verdict(old + new, threshold=2.0, warmup_s=60.0)
    assert [s["pid"] for s in v["segments"]] == [1, 2] and all(s["judged"] for s in v["segments"])
    assert len(v["failures"]) == 1 and "worker 2" in v["failures"][0]
    assert v["main"]["pid"] == 1  # the longest


def test_memory_row_adds_the_caches_own_bytes():
    stats = {"rss_bytes": 600 * 1024 * 1024, "pid": 3, "queue_depth": 1,
             "cache": {"bytes": 100 * 1024 * 1024, "capacity_bytes": 512 * 1024 * 1024},
             "kv_cache": {"bytes": 50 * 1024 * 1024, "capacity_bytes": 1024 * 1024 * 1024},
             "result_cache": {"entries": 5, "capacity": 256}}
    assert memory_row(12.0, stats) == {"t": 12.0, "pid": 3, "rss_mb": 600.0, "caches_mb": 150.0, "queue_depth": 1}
    assert memory_row(1.0, {"pid": 3}) is None
    heap = {"in_use": 300 * 2**20, "free": 50 * 2**20, "mmapped": 20 * 2**20, "arena": 350 * 2**20,
            "rss_anon": 500 * 2**20}
    row = memory_row(12.0, {**stats, "heap": heap})
    assert (row["live_less_caches_mb"], row["heap_free_mb"], row["rss_anon_mb"]) == (170.0, 50.0, 500.0)


def test_the_verdict_says_where_the_growth_is_and_is_not_judged_by_it():
    """Growth in the allocator's free-but-held bytes shows in `where`, apart from live bytes beyond
    the caches; the verdict stays RSS less caches."""
    rows = [{"t": 60.0 * i, "pid": 1, "rss_mb": 500.0 + 3.0 * i, "caches_mb": 100.0, "queue_depth": 0,
             "live_less_caches_mb": 170.0, "heap_free_mb": 50.0 + 3.0 * i, "rss_anon_mb": 480.0 + 3.0 * i}
            for i in range(8)]
    seg = memory_verdict(rows, threshold=2.0, warmup_s=60.0)["segments"][0]
    assert seg["where"] == {"live_less_caches_mb": 0.0, "heap_free_mb": 3.0, "rss_anon_mb": 3.0}
    assert seg["unexplained_slope"] == 3.0
    assert memory_row(1.0, {"rss_bytes": 1024 * 1024, "cache": {}, "kv_cache": {}})["caches_mb"] == 0.0


def test_worker_balances_count_a_new_worker_from_zero():
    def st(pid, req, done, busy=False):
        return {"pid": pid, "queue_depth": 0, "busy": busy, "counters": {"requests": req, "completed": done}}

    before = st(1, 10, 10)
    samples = [st(1, 40, 38, busy=True), st(1, 45, 45), st(2, 3, 3), st(2, 9, 8, busy=True)]
    after = st(2, 20, 20)
    rows = worker_balances(before, samples, after)
    assert rows == [{"pid": 1, "accepted": 35, "finished": 35, "idle_at_last_sample": True, "lost": 0},
                    {"pid": 2, "accepted": 20, "finished": 20, "idle_at_last_sample": True, "lost": 0}]
    busy_old = worker_balances(before, [st(1, 40, 38, busy=True)], after)
    assert busy_old[0]["lost"] is None and busy_old[0]["idle_at_last_sample"] is False
