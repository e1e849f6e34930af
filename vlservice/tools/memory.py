"""`python -m vlservice.tools.memory --workers 2`: are the weights shared between Gunicorn workers?

Starts `gunicorn -c gunicorn.conf.py wsgi:app` with the given number of workers on the model named
by `VL_MODEL`, waits until it is ready, answers one request, then prints each process's RSS, PSS
(its fair share of pages shared with others) and USS (pages only it has). With `preload_app` the
weights are read once in the master before the fork, so the workers' PSS is far below their RSS and
the total PSS is close to one copy of the model, not N.

`--pod`: what a container's memory limit sees. The server runs in a memory cgroup of its own (v1 or
v2, made here; needs root), sampled every 0.1 s from the first import through loading, readiness
and serving (four concurrent image requests, twice): the kernel's charge (`usage`, page cache of
the read checkpoint included), the working set Kubernetes evicts on (usage minus inactive file
pages) and anonymous memory, each at its peak per phase. `--limit-mib` also sets the cgroup's limit
and says whether the server loaded and served under it (no OOM kill, every request answered).
The Kubernetes manifests' memory requests and limits come from this (docs/bench/pod-memory-*.json).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]  # the repository: gunicorn.conf.py, wsgi.py


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_mib(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024)
    return 0


def _rollup_mib(pid: int) -> dict:
    """PSS split into anonymous memory (weights, heaps) and file pages (mapped checkpoint and
    libraries, which the kernel can drop and read again), from /proc/PID/smaps_rollup."""
    out = {"pss_anon_mib": 0, "pss_file_mib": 0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("Pss_Anon", "Pss_File"):
                out[key.lower() + "_mib"] = round(int(value.split()[0]) / 1024)
    except OSError:
        pass
    return out


def measure(workers: int, timeout: float = 900) -> dict:
    port = _free_port()
    env = {**os.environ, "VL_BIND": f"127.0.0.1:{port}", "VL_WORKERS": str(workers)}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        ready = 0
        while time.time() < deadline and ready < workers * 3:  # several answers: every worker warmed
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with code {proc.returncode} before it was ready")
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
                    ready += r.status == 200
            except OSError:
                pass
            time.sleep(1)
        body = json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}).encode()
        for _ in range(workers * 2):
            req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=300).read()
        master = psutil.Process(proc.pid)
        rows = []
        for p in [master] + master.children(recursive=True):
            m = p.memory_full_info()
            rows.append({"pid": p.pid, "role": "master" if p.pid == proc.pid else "worker",
                         "rss_mib": round(m.rss / 2**20), "pss_mib": round(m.pss / 2**20),
                         "uss_mib": round(m.uss / 2**20), **_rollup_mib(p.pid),
                         "peak_rss_mib": _peak_rss_mib(p.pid)})
        from ..config import Settings
        from ..obs.records import cpu_info

        import dataclasses

        settings = dataclasses.replace(Settings.from_env(), workers=workers)  # what the server read
        return {"cpu": cpu_info(settings.num_threads), "llm": settings.llm_quant or "float32", "prepack": settings.llm_prepack,
                "workers": workers, "processes": rows,
                "total_rss_mib": sum(r["rss_mib"] for r in rows), "total_pss_mib": sum(r["pss_mib"] for r in rows),
                "max_peak_rss_mib": max(r["peak_rss_mib"] for r in rows)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


class Cgroup:
    """A memory cgroup of our own under the machine's memory hierarchy (v2 unified or v1)."""

    def __init__(self, name: str, limit_mib: int | None):
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        self.v2 = v2.is_file() and "memory" in v2.read_text()
        self.path = Path("/sys/fs/cgroup" if self.v2 else "/sys/fs/cgroup/memory") / name
        self.path.mkdir(exist_ok=True)
        if limit_mib:
            self._write("memory.max" if self.v2 else "memory.limit_in_bytes", str(limit_mib << 20))

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def add_self_command(self) -> str:
        """A shell prefix that moves the shell into this cgroup before it execs the server."""
        return f"echo $$ > {self.path / 'cgroup.procs'} && exec "

    def sample(self) -> dict:
        stat = dict(line.split() for line in self._read("memory.stat").splitlines())
        usage = int(self._read("memory.current" if self.v2 else "memory.usage_in_bytes"))
        inactive = int(stat.get("inactive_file" if self.v2 else "total_inactive_file", 0))
        anon = int(stat.get("anon" if self.v2 else "total_rss", 0))  # v1: rss counts huge pages too
        return {"usage_mib": usage >> 20, "working_set_mib": max(0, usage - inactive) >> 20, "anon_mib": anon >> 20}

    def oom_kills(self) -> int:
        if self.v2:
            events = dict(line.split() for line in self._read("memory.events").splitlines())
            return int(events.get("oom_kill", 0))
        return int(dict(line.split() for line in self._read("memory.oom_control").splitlines()).get("oom_kill", 0))

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def pod(llm: str, limit_mib: int | None, timeout: float = 1800) -> dict:
    """Peaks of what the kernel charges a container running one worker, per phase (see --pod)."""
    import threading

    from ..config import Settings
    from .concurrency import run_clients
    from ..obs.records import cpu_info, run_record
    from .workloads import encode_jpeg, photo_like

    group = Cgroup(f"vlservice-pod-{os.getpid()}", limit_mib)
    port = _free_port()
    env = {**os.environ, "VL_BIND": f"127.0.0.1:{port}", "VL_WORKERS": "1", "VL_LLM_QUANT": "" if llm == "float32" else llm,
           "VL_ACCESS_LOG": ""}
    cmd = f"{group.add_self_command()}{sys.executable} -m gunicorn -c gunicorn.conf.py wsgi:app"
    phase = {"name": "loading"}
    peaks: dict = {}
    stop = threading.Event()

    def sampler():
        while not stop.wait(0.1):
            try:
                now = group.sample()
            except OSError:
                continue
            row = peaks.setdefault(phase["name"], {})
            for k, v in now.items():
                row[k] = max(row.get(k, 0), v)

    proc = subprocess.Popen(["sh", "-c", cmd], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    outcome: dict = {"loaded": False, "answered": 0, "asked": 0}
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None and not group.oom_kills():
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
                    if r.status == 200:
                        outcome["loaded"] = True
                        break
            except OSError:
                pass
            time.sleep(0.5)
        outcome["load_s"] = round(time.perf_counter() - t0, 1)
        if outcome["loaded"]:
            phase["name"] = "serving"
            seeds = iter(range(500, 10_000))
            for _ in range(2):
                jobs = [(encode_jpeg(photo_like(448, 448, seed=next(seeds))), "Describe this image.") for _ in range(4)]
                res = run_clients(url, jobs, 0.2, 32)
                outcome["asked"] += len(res)
                outcome["answered"] += sum(1 for r in res if "error" not in r and r["tokens"])
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
        except ProcessLookupError:
            pass
        stop.set()
        thread.join()
        oom = group.oom_kills()
        group.remove()
    settings = Settings.from_env()
    return {"cpu": cpu_info(settings.num_threads), **run_record(),
            "command": "python -m vlservice.tools.memory " + " ".join(sys.argv[1:]), "llm": llm, "limit_mib": limit_mib,
            "cgroup": "v2" if group.v2 else "v1", "phases": peaks, "oom_kills": oom, **outcome}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vlservice.tools.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", help="also write the report to this file")
    ap.add_argument("--pod", action="store_true", help="one worker in a memory cgroup: peaks per phase (root)")
    ap.add_argument("--llm", default="float32", help="with --pod: float32, int8 or int4")
    ap.add_argument("--limit-mib", type=int, help="with --pod: the cgroup's limit; did the server live under it?")
    args = ap.parse_args(argv)
    if args.pod:
        report = pod(args.llm, args.limit_mib)
        print(json.dumps(report, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
        ok = report["loaded"] and report["answered"] == report["asked"] and not report["oom_kills"]
        return 0 if ok else 1
    report = measure(args.workers)
    cpu = report["cpu"]
    print(f"*{cpu['model']} ({', '.join(cpu['flags'])}); {report['workers']} workers, LLM {report['llm']}*\n")
    print("| process | RSS MiB | PSS MiB | of which anonymous / file | USS MiB | peak RSS MiB |\n"
          "|---|---|---|---|---|---|")
    for r in report["processes"]:
        print(f"| {r['role']} {r['pid']} | {r['rss_mib']} | {r['pss_mib']} | {r['pss_anon_mib']} / "
              f"{r['pss_file_mib']} | {r['uss_mib']} | {r['peak_rss_mib']} |")
    print(f"| total | {report['total_rss_mib']} | {report['total_pss_mib']} | | | |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
