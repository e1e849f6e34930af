"""`python -m vlservice soak --serve`: the soak starts its own redis-server and Gunicorn (the demo model,
one worker, the caches' shared tier in that Redis), pauses Redis once and SIGTERMs the worker once, and
still accounts for every request: each one sent has one outcome, none lost (a 503 while the worker
drains or its replacement warms up is an expected refusal), and memory is reported against the
caches' budgets, per worker."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")]


def test_managed_soak_with_a_redis_pause_and_a_rolling_sigterm(tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, "-m", "vlservice", "soak", "--serve", "--seconds", "60", "--concurrency", "3",
                        "--sample-every", "3", "--warmup", "10", "--redis-pause", "8", "--json", str(out),
                        "--serve-dir", str(tmp_path / "serve")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr + (tmp_path / "serve" / "server.log").read_text()[-3000:]
    rep = json.loads(out.read_text())
    assert rep["verdict"] == "PASS" and rep["reasons"] == [] and rep["managed"] is True

    # every request accounted for: one outcome each, none lost, none unexpected
    t = rep["totals"]
    assert t["sent"] == t["ok"] + t["cancelled"] + t["expected_refusals"] + t["unexpected"]
    assert t["lost"] == 0 and t["unexpected"] == 0 and t["ok"] > 0
    assert sum(k["sent"] for k in rep["kinds"].values()) == t["sent"]
    assert rep["kinds"]["clip"]["ok"] > 0  # the MP4 clips were answered
    assert set(rep["expected_refusals"]) <= {"400 invalid_image", "400 invalid_json", "400 invalid_value",
                                             "429 server_busy", "503 draining", "503 not_ready", "503 queue_timeout"}

    # the faults, in order: Redis stopped and resumed, then the worker SIGTERMed and replaced
    events = [e["event"] for e in rep["events"]]
    assert events == ["redis_paused", "redis_resumed", "worker_sigterm", "worker_exited", "worker_ready"]
    times = {e["event"]: e["t_s"] for e in rep["events"]}
    assert 7 <= times["redis_resumed"] - times["redis_paused"] <= 12
    workers = rep["server"]["workers"]
    assert len(workers) == 2 and workers[0]["pid"] != workers[1]["pid"]
    assert workers[0]["pid"] == next(e["pid"] for e in rep["events"] if e["event"] == "worker_sigterm")
    assert workers[0]["shared_cache"]["outages"] >= 1  # the worker that lived through the pause noticed it
    assert workers[1]["lost"] == 0 and workers[1]["accepted"] == workers[1]["finished"] > 0
    assert rep["server"]["healthy_after"]

    # memory against the budgets: each cache's own bytes beside RSS, each worker a segment of its own
    m = rep["memory"]
    assert m["caches"]["cache"]["capacity_bytes"] == 512 * 1024 * 1024
    assert m["caches"]["kv_cache"]["capacity_bytes"] == 1024 * 1024 * 1024
    assert all(c["bytes"] > 0 and 0 < c["fill"] < 1 for c in m["caches"].values())
    assert [s["pid"] for s in m["segments"]] == [w["pid"] for w in workers]
    for s in m["segments"]:
        assert {"rss_slope", "caches_slope", "unexplained_slope", "judged"} <= set(s)
    assert all(len(row) == 5 and row[1] >= row[2] for row in m["samples"])  # RSS >= the caches' bytes
    assert m["threshold_mb_per_min"] == 2.0
    assert "feature cache (VL_FEATURE_CACHE_MB): MB / budget" in r.stdout
    assert "event at" in r.stdout and "worker_sigterm" in r.stdout


def test_allocators_compared_in_one_record_each_on_its_own_allocator(tmp_path):
    """`soak --serve --allocators`: one managed soak per allocator setting, one after the other,
    and one record; each variant's worker reports (in /api/stats) the allocator it ran on."""
    out = tmp_path / "allocators.json"
    r = subprocess.run([sys.executable, "-m", "vlservice", "soak", "--serve", "--seconds", "25", "--concurrency", "2",
                        "--sample-every", "3", "--warmup", "5", "--redis-pause", "3", "--allocators", "glibc",
                        "jemalloc", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    record = json.loads(out.read_text())
    assert list(record["variants"]) == ["glibc", "jemalloc"]
    assert record["cpu"] and record["date"]
    assert record["command"].startswith("python -m vlservice soak --serve --seconds")
    assert "--allocators glibc jemalloc" in record["command"]
    for name, variant in record["variants"].items():
        s = variant["summary"]
        assert s["allocator"] == name, s  # the variant took effect in the worker
        assert s["ok"] > 0 and s["lost"] == 0 and s["unexpected"] == 0
        assert variant["report"]["server"]["after"]["heap"]["allocator"] == name
        assert s["verdict"] in ("PASS", "FAIL") and s["answered_per_min"] > 0
    assert "| glibc | glibc |" in r.stdout and "| jemalloc | jemalloc |" in r.stdout
    assert out.with_suffix(".md").read_text().strip() in r.stdout  # the same table, beside the JSON
    bad = subprocess.run([sys.executable, "-m", "vlservice", "soak", "--seconds", "1", "--allocators", "mimalloc"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--allocators needs --serve" in bad.stderr
