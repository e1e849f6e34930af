"""`python -m vlservice soak --serve --allocators A B ...`: the managed soak once per allocator
setting, one after the other on the same machine, and one report that sets them side by side
(issue 45: which allocator keeps a worker's memory flat under constant load, at what speed).

Each variant is a whole managed soak (its own redis-server and Gunicorn, the same traffic seed,
the Redis pause and the rolling SIGTERM), judged by the same verdict: RSS less the caches' own
bytes per worker after warm-up. Beside it, the requests answered per minute and the median latency
of a new picture, so an allocator that holds memory flat by being slower shows it."""

from __future__ import annotations

import copy
import json
import sys
import time

# name -> the managed server's environment (VL_ALLOCATOR picks the library gunicorn.conf.py preloads)
VARIANTS = {
    "glibc": {"VL_ALLOCATOR": "glibc"},  # glibc's malloc, trimmed when the model goes idle
    "glibc-arenas2": {"VL_ALLOCATOR": "glibc", "MALLOC_ARENA_MAX": "2"},
    "glibc-trim": {"VL_ALLOCATOR": "glibc", "VL_MALLOC_TRIM_BUSY_S": "5"},  # trimmed while busy too
    "jemalloc": {"VL_ALLOCATOR": "jemalloc"},
    "tcmalloc": {"VL_ALLOCATOR": "tcmalloc"},
}


def summary(rep: dict) -> dict:
    """What the comparison shows of one variant's report."""
    m, t = rep["memory"], rep["totals"]
    minutes = rep["duration_s"] / 60.0
    segs = m.get("segments") or []
    judged = [s for s in segs if s.get("judged")]
    server = rep["server"]
    ran_on = sorted({(x.get("heap") or {}).get("allocator") or "unknown"
                     for x in (server["before"], server["after"]) if x and x.get("pid")})
    return {
        "allocator": ", ".join(ran_on),  # as the worker's /api/stats read it: the variant took effect
        "verdict": rep["verdict"], "reasons": rep["reasons"],
        "ok": t["ok"], "unexpected": t["unexpected"], "lost": t["lost"],
        "answered_per_min": round(t["ok"] / minutes, 1) if minutes else None,
        "new_image_p50_ms": rep["kinds"].get("new_image", {}).get("p50_ms"),
        "rss_max_mb": m["rss_max_mb"],
        "workers": [{"pid": s["pid"], "judged": s["judged"], "rss_less_caches_mb_per_min": s["unexplained_slope"],
                     "rss_mb_per_min": s["rss_slope"], "caches_mb_per_min": s["caches_slope"],
                     "where": s.get("where")} for s in segs],
        "worst_mb_per_min": max((s["unexplained_slope"] for s in judged if s["unexplained_slope"] is not None),
                                default=None),
    }


def markdown(record: dict) -> str:
    def f(v):
        return "-" if v is None else (f"{v:,.1f}" if isinstance(v, float) else f"{v:,}")

    cpu = record["cpu"]
    host = f"{cpu.get('model')} ({', '.join(cpu.get('flags') or [])}), {cpu.get('logical_cpus')} logical CPUs"
    lines = [f"# Allocators under the managed soak ({record['minutes']:g} min each, {record['concurrency']} clients)",
             "", f"CPU: {host}; {record['date']}; `{record['command']}`", "",
             "| variant | the worker's allocator | verdict | unexpected / lost | answered / min | new picture p50 ms "
             "| RSS max MB | per worker: RSS less caches MB/min (after warm-up) | per worker: free but held MB/min |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, v in record["variants"].items():
        if "error" in v:
            lines.append(f"| {name} | | did not run: {v['error']} | | | | | | |")
            continue
        s = v["summary"]
        slopes = ", ".join(f(w["rss_less_caches_mb_per_min"]) + ("" if w["judged"] else " (not judged)")
                           for w in s["workers"])
        held = ", ".join(f((w["where"] or {}).get("heap_free_mb")) for w in s["workers"])
        lines.append(f"| {name} | {s['allocator']} | {s['verdict']} | {s['unexpected']} / {s['lost']} | "
                     f"{f(s['answered_per_min'])} | {f(s['new_image_p50_ms'])} | "
                     f"{f(s['rss_max_mb'])} | {slopes} | {held} |")
    return "\n".join(lines)


def compare(args, duration: float, run_once) -> int:
    """Run `run_once` (soak.run_once) per variant in `args.allocators`; print and write the record."""
    unknown = [n for n in args.allocators if n not in VARIANTS]
    if unknown or not args.serve:
        print(f"error: --allocators needs --serve and names from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    from ..obs.records import cpu_info

    record = {"cpu": cpu_info(0), "date": time.strftime("%Y-%m-%d"),
              "command": args.command,
              "minutes": round(duration / 60.0, 2), "concurrency": args.concurrency, "seed": args.seed,
              "variants": {}}
    for name in args.allocators:
        one = copy.copy(args)
        one.allocators = None
        one.serve_dir = None
        one.server_env = [*(args.server_env or ()), *(f"{k}={v}" for k, v in VARIANTS[name].items())]
        print(f"soak: variant {name} ({' '.join(one.server_env)})", file=sys.stderr)
        rep = run_once(one, duration)
        if isinstance(rep, int):
            record["variants"][name] = {"error": f"exit {rep}", "env": VARIANTS[name]}
            continue
        record["variants"][name] = {"env": VARIANTS[name], "summary": summary(rep), "report": rep}
        if args.json:  # after each variant: a stopped comparison keeps what it measured
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(record, fh, indent=2)
    text = markdown(record)
    print(text)
    if args.json:
        from pathlib import Path

        Path(args.json).with_suffix(".md").write_text(text + "\n", encoding="utf-8")
    return 0 if all("summary" in v for v in record["variants"].values()) else 1
