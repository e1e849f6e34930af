"""`python -m vlservice bench --concurrency 1,2,4,8`: several users at once, through the real server.

For each LLM (float32 with prepacked weights, and the opt-in INT8) the real Gunicorn server is
started on the real-size random-weight checkpoint twice: with `VL_MAX_BATCH=1` (one request at a
time, the server before batching) and with `VL_MAX_BATCH` = the largest level. At each level N,
N streaming clients start a few hundred milliseconds apart, each with a new photo and 64 forced
tokens (greedy, result and KV caches off). Reported per level: aggregate decode tokens per second
(all streams' tokens after their first, over the time from the first stream's first token to the
last stream's last), the median stream's own decode rate, first-token p50 and p95, and the longest
gap between two tokens of one stream. Two scenarios follow at the batched setting: a new photo
arriving while three streams decode (its first token beside a lone request's), and a running
stream's longest gap while a 1024x768 document is encoded and prefilled.

Every output names the CPU (model, the flags that matter, threads) and the memory bandwidth
measured in the same run: compare ratios from one run on one machine only.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
from pathlib import Path

from .harness import Server, md_table, sse_chunks, start_report

log = logging.getLogger(__name__)

def stream(url: str, image: bytes, prompt: str, tokens: int, t0: float, answering=None, extra=None) -> dict:
    """One streaming request; token arrival times relative to `t0`. `answering` (a semaphore, if
    given) is released at the first token; `extra`: more fields for the body (the peer's)."""
    import base64

    import requests

    body = {"model": "x", "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": tokens, "min_tokens": tokens, "temperature": 0,
            "result_cache": False,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(image).decode()}},
                {"type": "text", "text": prompt}]}], **(extra or {})}
    start = time.perf_counter() - t0
    stamps: list = []
    timings: dict = {}
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=3600) as r:
        for chunk in sse_chunks(r):
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter() - t0)
                if answering is not None and len(stamps) == 1:
                    answering.release()
            timings = chunk.get("timings") or timings
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"start": start, "first": stamps[0] if stamps else None, "stamps": stamps,
            "ttft_s": (stamps[0] - start) if stamps else None, "tokens": len(stamps),
            "decode_tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0,
            "max_gap_s": max(gaps) if gaps else 0.0, "timings": timings}


def run_clients(url: str, jobs: list, stagger: float, tokens: int, extra=None) -> list:
    """`jobs`: [(image, prompt)], started `stagger` seconds apart."""
    results: list = [None] * len(jobs)
    t0 = time.perf_counter()

    def one(i, image, prompt):
        time.sleep(i * stagger)
        try:
            results[i] = stream(url, image, prompt, tokens, t0, extra=extra)
        except Exception as exc:  # recorded, reported, never hidden
            results[i] = {"error": repr(exc)}

    threads = [threading.Thread(target=one, args=(i, img, p)) for i, (img, p) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _pct(values: list, q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def level_summary(results: list) -> dict:
    ok = [r for r in results if "error" not in r and r["tokens"]]
    if not ok:
        return {"errors": [r.get("error") for r in results]}
    span = max(r["stamps"][-1] for r in ok) - min(r["first"] for r in ok)
    decoded = sum(r["tokens"] - 1 for r in ok)
    ttfts = [r["ttft_s"] for r in ok]
    return {"streams": len(results), "ok": len(ok),
            "aggregate_tps": round(decoded / span, 2) if span > 0 else 0.0,
            "stream_tps_median": round(statistics.median(r["decode_tps"] for r in ok), 2),
            "ttft_p50_s": round(_pct(ttfts, 50), 2), "ttft_p95_s": round(_pct(ttfts, 95), 2),
            "max_gap_s": round(max(r["max_gap_s"] for r in ok), 2),
            "errors": [r["error"] for r in results if "error" in r]}


SINGLE_RUNS = 3


def singles(url: str, photo, tokens: int, extra=None) -> dict:
    """One stream at a time, SINGLE_RUNS times: the server's own prompt time (prefill of the image and
    question, vision encode excluded) and the stream's decode rate, medians."""
    runs = [run_clients(url, [(photo(), "Describe this image.")], 0, tokens, extra)[0] for _ in range(SINGLE_RUNS)]
    ok = [r for r in runs if "error" not in r and r["tokens"] > 1]
    if not ok:
        return {"errors": [r.get("error") for r in runs]}
    return {"runs": len(ok), "decode_tps": round(statistics.median(r["decode_tps"] for r in ok), 3),
            "prompt_ms": round(statistics.median(r["timings"].get("prompt_ms", 0.0) for r in ok), 1),
            # llama-server reports no separate encode: its prompt time includes the image's
            "vision_encode_ms": (round(statistics.median(r["timings"]["vision_encode_ms"] for r in ok), 1)
                                 if all("vision_encode_ms" in r["timings"] for r in ok) else None),
            "ttft_s": round(statistics.median(r["ttft_s"] for r in ok), 2),
            # the answer up to its k-th text chunk as the client saw it (request sent to chunk k), and
            # the whole forced answer (to its last chunk; a random model's token is not always text)
            **{f"answer_{k}_s": round(statistics.median(r["stamps"][k - 1] - r["start"] for r in ok), 2)
               for k in ANSWER_TOKENS if k < tokens and all(len(r["stamps"]) >= k for r in ok)},
            f"answer_{tokens}_s": round(statistics.median(r["stamps"][-1] - r["start"] for r in ok), 2)}


ANSWER_TOKENS = (64, 128, 256)


def server_env(model_dir: Path, llm: str, max_batch: int, batch: int, tokens: int) -> dict:
    return {"VL_MODEL": str(model_dir), "VL_LLM_QUANT": "" if llm == "float32" else llm,
            "VL_MAX_BATCH": str(max_batch), "VL_QUEUE_SIZE": str(2 * batch + 4),
            "VL_RESULT_CACHE_ENTRIES": "0", "VL_KV_CACHE_MB": "0", "VL_DISK_CACHE_MB": "0",
            # room for the scenarios' long answer (8x the tokens) that outlasts a document's read
            "VL_QUEUE_TIMEOUT_S": "3600", "VL_MAX_TOKENS_CAP": str(max(tokens * 8, 1024))}


def measure(args, model_dir: Path, out: Path) -> dict:
    from .workloads import encode_jpeg, photo_like

    levels = [int(x) for x in args.concurrency.split(",")]
    batch = max(levels)
    size = (112, 112) if args.quick else (448, 448)
    doc_size = (192, 256) if args.quick else (768, 1024)
    seeds = iter(range(10_000, 1_000_000))  # a new photo for every request: nothing cached

    def photo():
        return encode_jpeg(photo_like(*size, seed=next(seeds)))

    llms = [q for q in args.llm.split(",")]
    report: dict = {"levels": levels, "tokens": args.tokens, "stagger_s": args.stagger, "runs": {}, "scenarios": {},
                    "single": {}, "peak_rss_mb": {}, "peak_pss_mb": {}, "peers": {}}
    if "float32" in llms:
        # The float32 LLM before prepacking (plain nn.Linear on MKL), one stream at a time: the baseline
        # for what prepacked weights buy a lone user.
        server = Server({**server_env(model_dir, "float32", 1, batch, args.tokens), "VL_LLM_PREPACK": "false"},
                        out / "server-float32-plain.log")
        try:
            server.wait_ready()
            run_clients(server.url, [(photo(), "Describe this image.")], 0, 4)
            report["single"]["float32 plain"] = singles(server.url, photo, args.tokens)
            log.info("float32 plain, one stream: %s", report["single"]["float32 plain"])
        finally:
            server.stop()
    for llm in llms:
        if llm == "int4":  # the graph's build on the first start (made here if need be, timed either way)
            from ..config import Settings
            from ..engine.model.ortdecode import ensure_decoder

            path, _ = ensure_decoder(model_dir, Settings.from_env().cache_path)
            report["int4_build_s"] = round(json.loads((path.parent / "build.json").read_text())["seconds"], 1)
        peers: list = []
        try:
            for kind in args.peer:  # all up at once (idle while another answers), so every level interleaves
                for pipeline in args.openvino_pipeline.split(",") if kind == "openvino" else [""]:
                    peer, peer_name = _start_peer(args, kind, model_dir, llm, batch, out, report, photo, pipeline)
                    if peer is not None:
                        peers.append((peer, peer_name))
                        report["peers"][peer_name] = {"kind": kind, "peer_of": llm,
                                                      "weights": _peer_module(kind).WEIGHTS[llm]}
            for max_batch in sorted({1, batch}):
                _measure_ours(report, model_dir, llm, max_batch, batch, levels, photo, doc_size, args, out,
                              peers if max_batch == batch else [])
            for peer, peer_name in peers:
                report["single"][peer_name] = singles(peer.url, photo, args.tokens, PEER_BODY)
                log.info("%s, one stream: %s", peer_name, report["single"][peer_name])
                report["peak_rss_mb"][peer_name] = peer.peak_rss_mb()
                report["peak_pss_mb"][peer_name] = peer.peak_pss_mb()
        finally:
            for peer, _ in peers:
                peer.stop()
    return report


def _peer_module(kind: str):
    from . import openvino_peer, peer as llama_cpp_peer

    return openvino_peer if kind == "openvino" else llama_cpp_peer


PEER_BODY = {"ignore_eos": True}  # llama-server's way to force the token count (ours: min_tokens)


def _start_peer(args, kind: str, model_dir: Path, llm: str, batch: int, out: Path, report: dict, photo,
                pipeline: str = "") -> tuple:
    """(the peer server beside our `llm`, up and past its first request, its name), or (None, None) when
    the peer has no weights of that kind: llama-server with `batch` slots, or OpenVINO GenAI (continuous
    batching over `batch` sequences, or VLMPipeline one request at a time), up beside ours: the same
    requests alternate."""
    from ..config import Settings

    settings = Settings.from_env()  # the same cache and thread count as ours
    peer_module = _peer_module(kind)
    if kind == "openvino":
        name = "OpenVINO {} " + (f"continuous batching x{batch}" if pipeline == "cb" else "VLMPipeline, one at a time")
        kwargs: dict = {"pipeline": pipeline}
    else:
        name, kwargs = "llama.cpp {} -np " + str(batch), {}
    if llm not in peer_module.LLM_TYPES:
        log.info("%s has no weights beside our %s LLM: no peer run for it", kind, llm)
        return None, None
    peer_name = name.format(peer_module.LLM_TYPES[llm])
    peer = peer_module.start_peer(model_dir, settings.cache_path, llm, batch, settings.num_threads,
                                  out / f"{kind}{'-' + pipeline if pipeline else ''}-server-{llm}.log", **kwargs)
    peer.wait_ready()
    run_clients(peer.url, [(photo(), "Describe this image.")], 0, 4, PEER_BODY)
    if hasattr(peer, "health"):  # OpenVINO compiles at its first request: reported apart
        report.setdefault("peer_first_request", {})[peer_name] = peer.health()
        log.info("%s first request: %s", peer_name, report["peer_first_request"][peer_name])
    return peer, peer_name


def _measure_ours(report, model_dir, llm, max_batch, batch, levels, photo, doc_size, args, out, peers):
    """Our server with `max_batch` at every level; each of `peers` ((server, name) pairs) at each
    level right after ours, in turn."""
    name = f"{llm} VL_MAX_BATCH={max_batch}"
    server = Server(server_env(model_dir, llm, max_batch, batch, args.tokens), out / f"server-{llm}-{max_batch}.log")
    try:
        t = time.perf_counter()
        server.wait_ready()
        log.info("%s ready in %.0f s", name, time.perf_counter() - t)
        run_clients(server.url, [(photo(), "Describe this image.")], 0, 4)  # the server's first request
        rows: dict = {}
        peer_rows: dict = {peer_name: {} for _, peer_name in peers}
        for n in levels:
            res = run_clients(server.url, [(photo(), "Describe this image.") for _ in range(n)], args.stagger, args.tokens)
            rows[str(n)] = level_summary(res)
            log.info("%s, %d streams: %s", name, n, rows[str(n)])
            for peer, peer_name in peers:
                res = run_clients(peer.url, [(photo(), "Describe this image.") for _ in range(n)], args.stagger,
                                  args.tokens, PEER_BODY)
                peer_rows[peer_name][str(n)] = level_summary(res)
                log.info("%s, %d streams: %s", peer_name, n, peer_rows[peer_name][str(n)])
        report["runs"][name] = {"llm": llm, "max_batch": max_batch, "levels": rows}
        for _, peer_name in peers:
            report["runs"][peer_name] = {"llm": peer_name, "max_batch": batch, "levels": peer_rows[peer_name],
                                         "peer_of": llm}
        if max_batch == 1:
            key = "float32 prepacked" if llm == "float32" else llm
            report["single"][key] = singles(server.url, photo, args.tokens)
            log.info("%s, one stream: %s", key, report["single"][key])
        if max_batch == batch:
            report["scenarios"][llm] = scenarios(server.url, photo, doc_size, args)
            log.info("%s scenarios: %s", name, report["scenarios"][llm])
        report["peak_rss_mb"][name] = server.peak_rss_mb()
        report["peak_pss_mb"][name] = server.peak_pss_mb()
    finally:
        server.stop()


def scenarios(url: str, photo, doc_size, args) -> dict:
    """A photo arriving while three streams decode; a stream's gaps while a document comes in."""
    from .workloads import document_like, encode_jpeg

    lone = run_clients(url, [(photo(), "Describe this image.")], 0, 8)[0]
    t0 = time.perf_counter()
    results: dict = {}

    answering = threading.Semaphore(0)

    def runner(i):
        results[i] = stream(url, photo(), "Describe this image.", args.tokens * 2, t0, answering)

    threads = [threading.Thread(target=runner, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for _ in threads:  # the newcomer arrives once all three are answering
        if not answering.acquire(timeout=600):
            raise RuntimeError("three streams did not start answering within 600 s")
    time.sleep(0.5)
    newcomer = stream(url, photo(), "Describe this image.", 8, t0)
    for t in threads:
        t.join()
    beside = newcomer["ttft_s"]
    # A running stream while a document is encoded and prefilled: long enough to outlast it.
    long_answer = 300 if args.quick else args.tokens * 8
    t0 = time.perf_counter()
    holder: dict = {}
    th = threading.Thread(target=lambda: holder.update(stream(url, photo(), "Describe this image.", long_answer, t0)))
    th.start()
    time.sleep(3.0 if not args.quick else 0.5)
    doc = encode_jpeg(document_like(*doc_size, seed=7))
    d0 = time.perf_counter() - t0
    docr = stream(url, doc, "Read all the text in this image.", 4, t0)
    d1 = d0 + docr["ttft_s"]
    th.join()
    during = [b - a for a, b in zip(holder["stamps"], holder["stamps"][1:]) if b > d0 and a < d1]
    return {"lone_ttft_s": round(lone["ttft_s"], 2), "ttft_beside_three_streams_s": round(beside, 2),
            "ttft_ratio": round(beside / lone["ttft_s"], 2),
            "doc_ttft_s": round(docr["ttft_s"], 2),
            "stream_max_gap_during_doc_s": round(max(during), 2) if during else None,
            "stream_median_gap_during_doc_s": round(statistics.median(during), 3) if during else None,
            **choices(url, photo, args.tokens, min(4, max(int(x) for x in args.concurrency.split(","))))}


def choices(url: str, photo, tokens: int, n: int = 4, runs: int = 3) -> dict:
    """One request for `n` choices (one prefill, the choices decoded together) beside one for a
    single answer, the same forced length, sampled, a new photo each, alternating: the whole
    answer's time (request sent to the last chunk), medians of `runs`."""
    times: dict = {1: [], n: []}
    for i in range(runs):
        for k in (1, n):
            t0 = time.perf_counter()
            r = stream(url, photo(), "Describe this image.", tokens, t0,
                       extra={"n": k, "temperature": 0.8, "seed": 100 + i})
            times[k].append(r["stamps"][-1] - r["start"])
    one, many = statistics.median(times[1]), statistics.median(times[n])
    return {"choices_n": n, "choices_answer_s": round(many, 2), "choices_1_answer_s": round(one, 2),
            "choices_ratio": round(many / one, 2)}


OURS_WEIGHTS = {"float32": "float32 LLM (prepacked), INT8 vision encoder",
                "int8": "INT8 LLM (per-row scales), INT8 vision encoder",
                "int4": "4-bit LLM, prompt and answer (ONNX Runtime MatMulNBits, blocks of 128 on the real size), "
                        "INT8 vision encoder"}


def peer_table(report: dict) -> list:
    """One table, ours and each peer beside it: weights, one stream (first token, decode rate, answers),
    the widest level's streams (aggregate and longest gap), the largest process's peak RSS and the
    whole server's peak PSS (ours: the one-stream server, VL_MAX_BATCH=1, beside a peer that served
    the same requests; the widest level's server in the RSS column)."""
    batch = max(report["levels"])
    answers = [k for k in ANSWER_TOKENS if k <= report["tokens"]]
    headers = ["server", "weights", "first token s", "decode tok/s", *(f"{k}-token answer s" for k in answers),
               f"{batch} streams: aggregate tok/s", f"{batch} streams: longest gap s", "peak RSS MB",
               "peak PSS MB, whole server"]
    table = []
    for llm in dict.fromkeys(p["peer_of"] for p in report["peers"].values()):
        rows = [(f"vlservice {llm}", OURS_WEIGHTS.get(llm, llm), "float32 prepacked" if llm == "float32" else llm,
                 f"{llm} VL_MAX_BATCH={batch}", f"{llm} VL_MAX_BATCH=1")]
        rows += [(name, p["weights"], name, name, name) for name, p in report["peers"].items() if p["peer_of"] == llm]
        for label, weights, single_key, run_key, pss_key in rows:
            one = report["single"].get(single_key, {})
            level = report["runs"].get(run_key, {}).get("levels", {}).get(str(batch), {})
            cells = [one.get("ttft_s", ""), one.get("decode_tps", ""), *(one.get(f"answer_{k}_s", "") for k in answers),
                     level.get("aggregate_tps", ""), level.get("max_gap_s", ""),
                     report.get("peak_rss_mb", {}).get(run_key, ""), report.get("peak_pss_mb", {}).get(pss_key, "")]
            table.append([label, weights, *cells])
    return md_table(headers, table)


def markdown(report: dict) -> str:
    cpu = report["cpu"]
    lines = [f"*{cpu['model']} ({', '.join(cpu['flags']) or 'no AVX-512'}), {cpu['threads']} threads, "
             f"{report['limits']['bandwidth_gb_s']} GB/s measured in this run; {report['tokens']} tokens per stream, "
             f"starts {report['stagger_s']} s apart, a new photo per request.*", ""]
    if report.get("peers"):
        lines[1:1] = ["", f"Beside the peers (one stream: medians of {SINGLE_RUNS}; the same client, images and "
                      "forced token counts; peak RSS: the largest process's VmHWM, Gunicorn's worker for ours):",
                      "", *peer_table(report), "", "Every level:"]
    runs, levels = report["runs"], []
    for run in runs.values():
        base = runs.get(f"{run.get('peer_of', run['llm'])} VL_MAX_BATCH=1", {}).get("levels", {})
        for n, row in run["levels"].items():
            if "aggregate_tps" not in row:
                levels.append([run["llm"], run["max_batch"], n, f"failed: {row.get('errors')}"])
                continue
            ratio = row["aggregate_tps"] / base[n]["aggregate_tps"] if base.get(n, {}).get("aggregate_tps") else None
            levels.append([run["llm"], run["max_batch"], n, row["aggregate_tps"], row["stream_tps_median"],
                           row["ttft_p50_s"], row["ttft_p95_s"], row["max_gap_s"], "%.2fx" % ratio if ratio else ""])
    lines += md_table(["LLM", "VL_MAX_BATCH", "streams", "aggregate decode tok/s", "per-stream tok/s (median)",
                       "first token p50 s", "first token p95 s", "longest gap s", "aggregate vs VL_MAX_BATCH=1"], levels)
    single = report.get("single", {})
    if single:
        plain = single.get("float32 plain", {})
        rows = []
        for key, row in single.items():
            if "decode_tps" not in row:
                rows.append([key, f"failed: {row.get('errors')}"])
                continue
            dr = row["decode_tps"] / plain["decode_tps"] if plain.get("decode_tps") else None
            pr = plain["prompt_ms"] / row["prompt_ms"] if plain.get("prompt_ms") and row["prompt_ms"] else None
            encode = "(in prompt)" if row["vision_encode_ms"] is None else row["vision_encode_ms"]
            rows.append([key, row["decode_tps"], row["prompt_ms"], encode, row["ttft_s"],
                         *(row.get(f"answer_{k}_s", "") for k in ANSWER_TOKENS),
                         "%.2fx" % dr if dr else "", "%.2fx" % pr if pr else ""])
        lines += ["", f"One stream at a time (medians of {SINGLE_RUNS}; prompt = the server's prefill of image and question):",
                  "", *md_table(["LLM", "decode tok/s", "prompt ms", "vision encode ms", "first token s",
                                 *(f"{k}-token answer s" for k in ANSWER_TOKENS), "decode vs plain float32",
                                 "prefill vs plain float32"], rows)]
    for name, h in report.get("peer_first_request", {}).items():  # not in the rows above: a warm-up request
        lines += ["", f"{name}: loaded in {h.get('load_s')} s; its first request (kernels compiled then, "
                  f"not measured above): first token {h.get('first_token_s')} s, done in {h.get('first_request_s')} s"]
    if report["scenarios"]:
        lines += ["", *md_table(["LLM", "lone request first token s", "beside three streams s", "ratio",
                                 "document first token s", "a stream's longest gap while the document is read s",
                                 "median gap then s"],
                                [[llm, s["lone_ttft_s"], s["ttft_beside_three_streams_s"], f"{s['ttft_ratio']}x",
                                  s["doc_ttft_s"], s["stream_max_gap_during_doc_s"], s["stream_median_gap_during_doc_s"]]
                                 for llm, s in report["scenarios"].items()])]
        lines += ["", *md_table(["LLM", "one answer s", "several choices (`n`) s", "ratio"],
                                [[llm, s.get("choices_1_answer_s", ""),
                                  f"{s.get('choices_answer_s', '')} (n = {s.get('choices_n', '')})",
                                  f"{s['choices_ratio']}x" if "choices_ratio" in s else ""]
                                 for llm, s in report["scenarios"].items()])]
    if report.get("int4_build_s") is not None:
        lines += ["", f"The int4 graph's build on the first start: {report['int4_build_s']} s."]
    return "\n".join(lines) + "\n"


def chart(report: dict, path: Path) -> None:
    """Aggregate decode tok/s per level, one line per configuration (OpenCV)."""
    import cv2
    import numpy as np

    runs = report["runs"]
    levels = [str(n) for n in report["levels"]]
    w, h, left, top = 760, 420, 70, 40
    img = np.full((h + 90, w, 3), 255, np.uint8)
    top_val = max((r["levels"][n].get("aggregate_tps", 0) for r in runs.values() for n in levels), default=1) or 1
    colors = [(200, 80, 40), (40, 140, 220), (60, 170, 80), (150, 60, 170)]
    for k, (name, run) in enumerate(runs.items()):
        pts = []
        for i, n in enumerate(levels):
            v = run["levels"][n].get("aggregate_tps", 0)
            pts.append((left + int(i * (w - left - 40) / max(1, len(levels) - 1)), top + h - int(v / top_val * (h - 20))))
        for a, b in zip(pts, pts[1:]):
            cv2.line(img, a, b, colors[k % 4], 2, cv2.LINE_AA)
        for p in pts:
            cv2.circle(img, p, 4, colors[k % 4], -1, cv2.LINE_AA)
        cv2.putText(img, name, (left, h + top + 20 + 16 * k), cv2.FONT_HERSHEY_SIMPLEX, 0.45, colors[k % 4], 1,
                    cv2.LINE_AA)
    for i, n in enumerate(levels):
        x = left + int(i * (w - left - 40) / max(1, len(levels) - 1))
        cv2.putText(img, n, (x - 4, top + h + 5), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.putText(img, f"aggregate decode tok/s (max {top_val:.1f}) vs concurrent streams", (left, 25),
                cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.imwrite(str(path), img)


def _openvino_env() -> int:
    """0 once OpenVINO's tool environment is there (made now if need be); 2, saying which step failed, if not."""
    from ..config import Settings
    from .openvino_peer import ToolEnvError, ensure_env

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        ensure_env(Settings.from_env().cache_path)
    except ToolEnvError as e:
        print(f"bench --peer openvino: {e}", file=sys.stderr)
        return 2
    return 0


PEERS = ("llama.cpp", "openvino")


def _pipelines(text: str) -> str:
    """`--openvino-pipeline`'s value: cb, vlm or both, comma-separated."""
    kinds = list(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if not kinds or any(k not in ("cb", "vlm") for k in kinds):
        raise argparse.ArgumentTypeError(f"expected cb, vlm or cb,vlm, got {text!r}")
    return ",".join(kinds)


def _peers(text: str) -> list:
    """`--peer`'s value: known peers, in the order given, each once."""
    kinds = list(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown peer {', '.join(unknown)} (choose from {', '.join(PEERS)})")
    return kinds


def main(argv=None) -> int:

    ap = argparse.ArgumentParser(prog="python -m vlservice bench --concurrency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--llm", default="float32,int8", help="comma-separated: float32, int8, int4 (peers beside "
                    "them: llama.cpp f32, Q8_0, Q4_K_M; OpenVINO int8, int4)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--stagger", type=float, default=0.3, help="seconds between client starts")
    ap.add_argument("--quick", action="store_true", help="the same code on a tiny checkpoint")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--peer", type=_peers, default=[], help="also peers (comma-separated: llama.cpp, openvino), "
                    "level by level after ours: "
                    "llama.cpp's llama-server, built from the llama-cpp-python source package and run on the same "
                    "checkpoint converted to GGUF (f32 beside float32, q8_0 beside int8; needs cmake, a C++ compiler "
                    "and `pip install sentencepiece`; see vlservice/tools/peer.py), or OpenVINO GenAI on the same "
                    "checkpoint exported with optimum-intel (int8 beside int8, int4 beside int4; its own tool "
                    "environment under VL_CACHE_DIR/openvino; see vlservice/tools/openvino_peer.py)")
    ap.add_argument("--openvino-pipeline", type=_pipelines, default="cb",
                    help="with --peer openvino: cb, ContinuousBatchingPipeline (as OpenVINO Model Server serves a "
                    "VLM), vlm, VLMPipeline (one request at a time), or both (cb,vlm: two peers)")
    args = ap.parse_args(argv)
    if "llama.cpp" in args.peer:
        from .peer import missing

        if missing():
            print(f"bench --peer llama.cpp needs {missing()}", file=sys.stderr)
            return 2
    if "openvino" in args.peer:
        if code := _openvino_env():
            return code
    _, model_dir, report = start_report(args)
    report.update(measure(args, model_dir, args.out))
    (args.out / "concurrency.json").write_text(json.dumps(report, indent=2))
    (args.out / "concurrency.md").write_text(markdown(report))
    chart(report, args.out / "concurrency.png")
    print((args.out / "concurrency.md").read_text())
    failed = any("aggregate_tps" not in row for run in report["runs"].values() for row in run["levels"].values())
    failed = failed or any("decode_tps" not in row for row in report["single"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
