"""The allocator a server starts on (vlservice/allocator.py, issue 45): `VL_ALLOCATOR` names it,
gunicorn.conf.py re-executes the master once with its library preloaded, and the heap statistics
are read from the allocator the process runs on. tests/run.sh installs jemalloc and tcmalloc."""

import json
import os
import subprocess
import sys

import pytest

from vlservice import allocator
from vlservice.config import Settings


def test_jemalloc_and_tcmalloc_are_found_where_debian_installs_them():
    for name in ("jemalloc", "tcmalloc"):
        path = allocator.find(name)
        assert path is not None and os.path.isfile(path), name


def test_auto_means_jemalloc_when_installed_and_glibc_asks_for_nothing():
    assert allocator.wanted("auto") == "jemalloc"
    assert allocator.wanted("glibc") is None
    assert allocator.wanted("tcmalloc") == "tcmalloc"


def test_a_process_not_on_the_allocator_re_executes_itself_with_its_library_preloaded(monkeypatch):
    calls = []
    monkeypatch.setenv("LD_PRELOAD", "/some/other.so")
    monkeypatch.delenv("VL_ALLOCATOR_EXEC", raising=False)
    assert allocator.loaded() == "glibc"  # pytest itself runs on glibc's malloc
    allocator.ensure("jemalloc", execv=lambda path, argv, env: calls.append((path, argv, env)))
    (path, argv, env), = calls
    assert path == sys.executable and argv == list(sys.orig_argv)
    assert env["LD_PRELOAD"] == allocator.find("jemalloc") + ":/some/other.so"  # first, the rest kept
    assert env["VL_ALLOCATOR_EXEC"] == allocator.find("jemalloc")


def test_glibc_and_an_allocator_already_loaded_never_re_execute():
    def no_exec(*_):
        raise AssertionError("re-executed")

    assert allocator.ensure("glibc", execv=no_exec) == "glibc"


def test_a_library_that_did_not_load_after_the_re_exec_is_an_error_not_a_loop(monkeypatch):
    monkeypatch.setenv("VL_ALLOCATOR_EXEC", allocator.find("tcmalloc"))
    with pytest.raises(ValueError, match="did not load"):
        allocator.ensure("tcmalloc", execv=lambda *_: pytest.fail("re-executed twice"))


def test_unknown_settings_are_refused_by_settings_and_by_ensure():
    with pytest.raises(ValueError, match="VL_ALLOCATOR"):
        Settings.from_env(env={"VL_ALLOCATOR": "mimalloc"})
    with pytest.raises(ValueError, match="choose one of"):
        allocator.ensure("mimalloc")
    assert Settings.from_env(env={}).allocator == "auto"


HEAP = """
import json
from vlservice import allocator
from vlservice.engine.reclaim import heap, malloc_trim
keep = [bytearray(4096) for _ in range(20000)]  # 80 MB live in small blocks
print(json.dumps({"loaded": allocator.loaded(), "heap": heap(), "trimmed": malloc_trim()}))
"""


@pytest.mark.parametrize("name", ["glibc", "jemalloc", "tcmalloc"])
def test_the_heap_is_read_from_the_allocator_the_process_runs_on(name):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if name != "glibc":
        env["LD_PRELOAD"] = allocator.find(name)
    r = subprocess.run([sys.executable, "-c", HEAP], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["loaded"] == name and out["heap"]["allocator"] == name
    assert 80e6 <= out["heap"]["in_use"] < 400e6  # the 80 MB held, as this allocator counts it
    assert out["heap"]["free"] >= 0 and out["heap"]["rss_anon"] >= 80e6
    assert out["trimmed"] is (name == "glibc")  # malloc_trim is glibc's alone


def test_the_scheduler_trims_while_busy_only_when_asked_and_at_most_that_often():
    from vlservice.engine.reclaim import Trimmer

    clock = [100.0]

    def now():
        return clock[0]

    idle_only, busy_too, off = Trimmer(True, clock=now), Trimmer(True, 5.0, clock=now), Trimmer(False, 5.0, clock=now)
    for t in (idle_only, busy_too, off):
        t.busy()
    assert (idle_only.trims, busy_too.trims, off.trims) == (0, 1, 0)
    clock[0] += 4.0
    busy_too.busy()
    assert busy_too.trims == 1  # not before 5 s
    clock[0] += 1.0
    busy_too.busy()
    idle_only.idle()
    off.idle()
    assert (idle_only.trims, busy_too.trims, off.trims) == (1, 2, 0)
    idle_only.idle()
    assert idle_only.trims == 1  # at most once a second
