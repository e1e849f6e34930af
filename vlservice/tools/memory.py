"""`python -m vlservice.tools.memory --workers 2`: are the weights shared between Gunicorn workers?

Starts `gunicorn -c gunicorn.conf.py wsgi:app` with the given number of workers on the model named
by `VL_MODEL`, waits until it is ready, answers one request, then prints each process's RSS, PSS
(its fair share of pages shared with others) and USS (pages only it has). With `preload_app` the
weights are read once in the master before the fork, so the workers' PSS is far below their RSS and
the total PSS is close to one copy of the model, not N.
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
        from .concurrency import cpu_info

        import dataclasses

        settings = dataclasses.replace(Settings.from_env(), workers=workers)  # what the server read
        return {"cpu": cpu_info(settings.num_threads), "llm": settings.llm_quant or "float32", "prepack": settings.llm_prepack,
                "workers": workers, "processes": rows,
                "total_rss_mib": sum(r["rss_mib"] for r in rows), "total_pss_mib": sum(r["pss_mib"] for r in rows),
                "max_peak_rss_mib": max(r["peak_rss_mib"] for r in rows)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vlservice.tools.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", help="also write the report to this file")
    args = ap.parse_args(argv)
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
