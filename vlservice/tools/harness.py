"""What the benchmark scripts share: the machine they ran on (CPU, memory bandwidth and GEMM
throughput measured in the same run), the record of a run (date, command), the real server
started as users start it, and a streamed answer's chunks.

Here so that the scripts (`bench`, `concurrency`, the peers, `replicas`, ...) import these from
one place and never each other in a circle.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..obs.records import cpu_info, run_record

ROOT = Path(__file__).resolve().parents[2]
class Server:
    """The real server, started as users start it, for one configuration."""

    ready_path = "/readyz"

    def __init__(self, env: dict, log_path: Path):
        from .services import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {**os.environ, **env, "VL_BIND": f"127.0.0.1:{self.port}", "VL_ACCESS_LOG": ""}
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"],
                                     cwd=ROOT, env=full, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.watch_pss()

    def watch_pss(self, interval: float = 0.5) -> None:
        """Sample the whole process tree's PSS (each page shared by several processes counted once,
        in shares) every `interval` s from now until `stop()`: what the server costs the machine,
        the same measure for every server (`peak_pss_mb`)."""
        import threading

        self._pss_peak = 0.0
        self._pss_stop = threading.Event()

        def run():
            while not self._pss_stop.wait(interval):
                total = tree_pss_mb(self.proc.pid)
                if total is None:
                    return
                self._pss_peak = max(self._pss_peak, total)

        threading.Thread(target=run, name="pss-sampler", daemon=True).start()

    def peak_pss_mb(self) -> float | None:
        """The peak of the whole process tree's PSS sampled so far, MB."""
        return round(self._pss_peak, 0) if getattr(self, "_pss_peak", 0) else None

    def wait_ready(self, timeout: float = 1800) -> None:
        import requests

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if requests.get(self.url + self.ready_path, timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise RuntimeError("the server did not become ready")

    def peak_rss_mb(self) -> float | None:
        """The largest peak resident set (VmHWM) among the server's processes, MB: Gunicorn's worker
        (the preloaded model's pages counted in it), a peer's single process. None once it has exited."""
        import psutil

        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return None
        peaks = []
        for p in procs:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    peaks += [int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")]
            except OSError:
                continue
        return round(max(peaks), 0) if peaks else None

    def stop(self) -> None:
        if hasattr(self, "_pss_stop"):
            self._pss_stop.set()
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
        except ProcessLookupError:
            pass  # it had already exited
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def tree_pss_mb(pid: int) -> float | None:
    """The PSS of `pid` and all its descendants, MB (from /proc/<pid>/smaps_rollup); None once `pid`
    has exited."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    total = 0
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except OSError:
            continue
    return total / 1024


def sse_chunks(response):
    """The parsed `data:` chunks of a streamed chat completion; an error chunk raises."""
    response.raise_for_status()
    for line in response.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(chunk["error"])
        yield chunk


def machine_limits(threads: int, quick: bool) -> dict:
    """Streamed GEMV bandwidth and fp32 GEMM throughput, measured now, on this machine."""
    import torch

    torch.set_num_threads(threads)
    n = 2048 if quick else 8192
    a = torch.randn(n, n * (1 if quick else 4))  # 64 MiB quick, 1 GiB full: far beyond the caches
    x = torch.randn(a.shape[1])
    torch.mv(a, x)
    reps = 3 if quick else 5
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.mv(a, x)
        times.append(time.perf_counter() - t)
    bw = a.numel() * 4 / min(times) / 1e9
    m = 1024 if quick else 2048
    p, q = torch.randn(m, m), torch.randn(m, m)
    torch.mm(p, q)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(p, q)
        times.append(time.perf_counter() - t)
    gflops = 2 * m**3 / min(times) / 1e9
    return {"bandwidth_gb_s": round(bw, 2), "gemm_gflop_s": round(gflops, 1)}


def start_report(args) -> tuple:
    """Logging, settings, the output folder, the checkpoint, and a report that names the machine:
    (settings, model folder, report)."""
    from ..config import Settings
    from .workloads import bench_model

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir, _ = bench_model(settings.cache_path, args.quick)
    return settings, model_dir, {"cpu": cpu_info(settings.num_threads), **run_record(),
                                 "limits": machine_limits(settings.num_threads, args.quick)}


def md_table(headers: list, rows: list, colalign: tuple | None = None) -> list[str]:
    """A GitHub Markdown table (`tabulate`), as lines; cells are written as given (numbers already
    formatted, never parsed again), a short row padded with empty cells."""
    from tabulate import tabulate

    return tabulate([[str(c) for c in row] for row in rows], [str(h) for h in headers], tablefmt="github",
                    disable_numparse=True, colalign=colalign).splitlines()
