"""`python -m vlservice bench --levers`: the system settings, each measured against the default.

Each variant runs in a child process of its own (an allocator is chosen with `LD_PRELOAD` before
the process starts; thread pools and affinity are fixed at start), on the real-size checkpoint with
the fastest configuration (ONNX INT8 vision, INT8 LLM from its store, caches off): a new photo per
run, 32 tokens. Variants run in two passes, forward then backward (A B C ... C B A), so that a
drift of this shared machine weighs on all of them alike; medians over both passes. Also measured:
decode + preprocessing of a text page sent in colour and in grayscale.

Variants: the default (glibc malloc, threads = physical cores); jemalloc; tcmalloc; one thread;
OpenMP threads bound to cores (`OMP_PROC_BIND=close OMP_PLACES=cores`); `MALLOC_ARENA_MAX=2`.
Allocators that are not installed are reported as such, not silently left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ALLOCATORS = {
    "jemalloc": ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"),
    "tcmalloc": ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                 "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"),
}


def find_allocator(name: str) -> str | None:
    return next((p for p in ALLOCATORS[name] if os.path.isfile(p)), None)


def variants() -> dict[str, dict | None]:
    out: dict[str, dict | None] = {"default": {}}
    for name in ALLOCATORS:
        lib = find_allocator(name)
        out[name] = {"LD_PRELOAD": lib} if lib else None
    out["MALLOC_ARENA_MAX=2"] = {"MALLOC_ARENA_MAX": "2"}
    out["threads=1"] = {"VL_THREADS": "1"}
    out["OMP bound to cores"] = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
    return out


def _peak_rss_mib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024)
    return 0


def child(runs: int, quick: bool, offset: int) -> dict:
    """One variant: load the service, answer `runs` new photos (plus one unmeasured warm-up)."""
    from .workloads import WORKLOADS, Ours, bench_model, workload_images
    from ..config import Settings
    from ..engine.service import load_service

    base = Settings.from_env()
    model_dir, _ = bench_model(base.cache_path, quick)
    settings = Settings(model=str(model_dir), cache_dir=str(base.cache_path), threads=base.threads,
                        vision_backend="onnx-int8", llm_quant="int8", disk_cache_mb=0, kv_cache_mb=0,
                        result_cache_entries=0, warmup=False)
    t0 = time.perf_counter()
    svc = load_service(settings)
    load_s = time.perf_counter() - t0
    ours = Ours(svc, "lever")
    images = workload_images(quick)["photo"]
    rows = [ours.run(images[(offset + i) % len(images)], WORKLOADS["photo"]["prompt"], 32) for i in range(runs + 1)]
    rows = rows[1:]
    return {"load_s": load_s, "ttft_ms": [r["ttft_ms"] for r in rows], "total_ms": [r["total_ms"] for r in rows],
            "decode_tps": [r["decode_tps"] for r in rows], "vision_ms": [r["vision_encode_ms"] for r in rows],
            "peak_rss_mib": _peak_rss_mib(), "threads": svc.settings.num_threads}


def grayscale(quick: bool, runs: int) -> dict:
    """Decode + preprocess of a text page in colour and in grayscale (same pixels, one channel)."""
    import cv2

    from ..engine.media import images as I
    from .workloads import document_like
    from ..build.checkpoints import preprocessor_config, real_architecture

    spec = I.ImageSpec.from_preprocessor_config(preprocessor_config(real_architecture()))
    page = document_like(192, 256, seed=3) if quick else document_like(768, 1024, seed=3)
    gray = cv2.cvtColor(page, cv2.COLOR_RGB2GRAY)
    data = {"colour": cv2.imencode(".png", cv2.cvtColor(page, cv2.COLOR_RGB2BGR))[1].tobytes(),
            "grayscale": cv2.imencode(".png", gray)[1].tobytes()}
    out = {}
    for name, blob in data.items():
        times = []
        for _ in range(max(5, runs * 5)):
            t0 = time.perf_counter()
            p = I.prepare(I.decode(blob), spec)
            times.append((time.perf_counter() - t0) * 1e3)
        out[name] = {"ms": statistics.median(times), "bytes": len(blob), "tokens": p.num_tokens}
    return out


def run(runs: int, quick: bool) -> dict:
    names = variants()
    order = [n for n, env in names.items() if env is not None]
    results: dict = {n: [] for n in order}
    # two passes in opposite orders, so drift on a shared machine favours no setting; --quick (the
    # code path on a tiny checkpoint, measuring nothing) makes one
    for pass_no, seq in enumerate((order,) if quick else (order, order[::-1])):
        for name in seq:
            env = {**os.environ, **names[name]}
            cmd = [sys.executable, "-m", "vlservice.tools.levers", "--child", "--runs", str(runs),
                   "--offset", str(pass_no * runs)] + (["--quick"] if quick else [])
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{name}: {proc.stderr[-2000:]}")
            results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    summary = {}
    for name, parts in results.items():
        merged = {k: [v for p in parts for v in p[k]] for k in ("ttft_ms", "total_ms", "decode_tps", "vision_ms")}
        summary[name] = {k: statistics.median(v) for k, v in merged.items()}
        summary[name]["peak_rss_mib"] = max(p["peak_rss_mib"] for p in parts)
        summary[name]["load_s"] = statistics.median(p["load_s"] for p in parts)
        summary[name]["n"] = len(merged["ttft_ms"])
    return {"summary": summary, "missing": [n for n, env in names.items() if env is None],
            "grayscale": grayscale(quick, runs), "runs": runs, "quick": quick}


def markdown(report: dict) -> str:
    from .harness import md_table

    base = report["summary"]["default"]
    lines = md_table(["setting", "first token s", "32-token answer s", "decode tok/s", "vision ms", "peak RSS MiB",
                      "answer vs default"],
                     [[name, f"{r['ttft_ms'] / 1e3:.2f}", f"{r['total_ms'] / 1e3:.2f}", f"{r['decode_tps']:.2f}",
                       f"{r['vision_ms']:.0f}", r["peak_rss_mib"], f"{base['total_ms'] / r['total_ms']:.2f}x"]
                      for name, r in report["summary"].items()]
                     + [[name, "not installed"] for name in report["missing"]])
    g = report["grayscale"]
    lines += ["", f"Text page decode + preprocessing: colour {g['colour']['ms']:.1f} ms ({g['colour']['bytes']} bytes), "
              f"grayscale {g['grayscale']['ms']:.1f} ms ({g['grayscale']['bytes']} bytes); "
              f"{g['colour']['tokens']} image tokens either way, so the encoder and the LLM do the same work."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vlservice bench --levers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.runs, args.quick, args.offset)))
        return 0
    report = run(args.runs, args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "levers.json").write_text(json.dumps(report, indent=2))
    (args.out / "levers.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
