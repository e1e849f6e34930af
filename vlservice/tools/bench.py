"""`python -m vlservice bench`: the real-size model, baseline and vlservice side by side, one run.

Real weights cannot be downloaded here, but a random-weight checkpoint of the exact architecture
(`assets/qwen3-vl-2b-instruct.config.json`) runs at exactly the real speed. It is built once,
seeded, under `VL_CACHE_DIR/bench-model`, and its vision encoder exported and quantised there.

In one process, over one copy of the weights, variants are interleaved run by run (A B C ... A B
C ...) so that drift on a shared machine hits all of them alike:

- baseline: what users run without us: the Hugging Face image processor (PIL backend), the
  tokenizer's chat template and `model.generate`, PyTorch float32, vision in PyTorch, no cache;
- vlservice with each vision backend (torch, onnx-fp32, onnx-int8) on a new image (cold), the same
  image again (warm: feature cache hit), and a follow-up question in the same conversation.

Every answer is forced to the same length (min = max new tokens), greedy. Reported: medians of
the runs with min and max per stage, each variant's end-to-end and first-token ratio to the
baseline computed pair by pair (run i of the variant against run i of the baseline), peak RSS,
build/export/quantise times, ONNX sizes, the INT8 encoder's fidelity, and the machine's limits
measured in the same run (memory bandwidth, GEMM throughput) with the fraction of each we reach.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from .harness import machine_limits, md_table
from .workloads import WORKLOADS, Ours, bench_model, workload_images

log = logging.getLogger(__name__)

STAGES = ("image_decode_ms", "preprocess_ms", "vision_encode_ms", "prompt_ms", "decode_ms")


# --------------------------------------------------------------------------- baseline

class Baseline:
    """The Hugging Face path: PIL processor, chat template, `model.generate` (vision in PyTorch)."""

    name = "baseline"

    def __init__(self, model, tokenizer, model_dir: Path):
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        pre = json.loads((model_dir / "preprocessor_config.json").read_text())
        self.processor = Qwen2VLImageProcessorPil(**{k: pre[k] for k in (
            "patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std", "size")})
        self.model, self.tok = model, tokenizer
        self._vision_s = 0.0
        model.model.visual.register_forward_pre_hook(self._vision_start)
        model.model.visual.register_forward_hook(self._vision_end)

    def _vision_start(self, *_):
        self._t_vision = time.perf_counter()

    def _vision_end(self, *_):
        self._vision_s += time.perf_counter() - self._t_vision

    def run(self, image: bytes, prompt: str, tokens: int, history=None) -> dict:
        import torch
        from PIL import Image
        from transformers import LogitsProcessor, LogitsProcessorList

        t0 = time.perf_counter()
        pil = Image.open(io.BytesIO(image)).convert("RGB")
        t1 = time.perf_counter()
        px = self.processor(images=[pil], return_tensors="pt")
        t2 = time.perf_counter()
        n = int(px["image_grid_thw"].prod()) // 4
        chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        text = self.tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        ids = self.tok(text.replace("<|image_pad|>", "<|image_pad|>" * n), return_tensors="pt")
        mm = (ids["input_ids"] == self.model.config.image_token_id).int()
        stamps = []

        class Stamp(LogitsProcessor):
            def __call__(self, input_ids, scores):
                stamps.append(time.perf_counter())
                return scores

        self._vision_s = 0.0
        with torch.inference_mode():
            self.model.generate(**ids, pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"],
                                mm_token_type_ids=mm, max_new_tokens=tokens, min_new_tokens=tokens,
                                do_sample=False, logits_processor=LogitsProcessorList([Stamp()]))
        t_end = time.perf_counter()
        ttft = stamps[0] - t0
        return {"image_decode_ms": (t1 - t0) * 1e3, "preprocess_ms": (t2 - t1) * 1e3,
                "vision_encode_ms": self._vision_s * 1e3,
                "prompt_ms": (stamps[0] - t2 - self._vision_s) * 1e3, "ttft_ms": ttft * 1e3,
                "decode_ms": (t_end - stamps[0]) * 1e3, "total_ms": (t_end - t0) * 1e3,
                "decode_tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0,
                "prompt_n": int(ids["input_ids"].shape[1]), "predicted_n": len(stamps)}


def model_costs(model, prompt_tokens: dict, image_patches: dict) -> dict:
    """Bytes read per decoded token, and matmul FLOPs of vision and prefill per workload.

    Vision: the blocks run on every patch, the mergers on every merged token (patches / 4), plus
    attention (QK^T and AV over all patches of the image). Prefill: every prompt token through
    the decoder layers, the LM head on the last token only."""
    text = model.model.language_model
    lm_params = sum(p.numel() for p in text.parameters()) - text.embed_tokens.weight.numel()
    head = model.lm_head.weight.numel()
    visual = model.model.visual
    vision = sum(p.numel() for p in visual.parameters())
    mergers = sum(p.numel() for n, p in visual.named_parameters() if "merger" in n)
    blocks = vision - mergers
    width = visual.config.hidden_size
    depth = visual.config.depth

    def vision_flops(n):
        return 2 * blocks * n + 2 * mergers * n / 4 + depth * 4 * n * n * width

    return {
        "llm_bytes_per_token": (lm_params + head) * 4,
        "vision_flops": {k: vision_flops(n) for k, n in image_patches.items()},
        "prefill_flops": {k: 2 * lm_params * n + 2 * head for k, n in prompt_tokens.items()},
        "params": {"vision": vision, "language": lm_params + text.embed_tokens.weight.numel()},
    }


# --------------------------------------------------------------------------- the run

def run(out: Path, runs: int, tokens: int, quick: bool, cache_dir: Path, threads: int) -> dict:
    import torch
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    from ..config import Settings
    from ..engine.model.checkpoints import ModelSource
    from ..engine.service import VLModelService
    from ..engine.model.vision import ensure_onnx

    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(threads)
    model_dir, build_s = bench_model(cache_dir, quick)
    t0 = time.perf_counter()
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    source = ModelSource(path=model_dir, name="bench")
    services, export = {}, {}
    for backend in ("torch", "onnx-fp32", "onnx-int8"):
        settings = Settings(model=str(model_dir), cache_dir=str(cache_dir), vision_backend=backend,
                            threads=threads, disk_cache_mb=0, max_context_tokens=32768)
        if backend != "torch":
            _, export[backend] = ensure_onnx(model_dir, model.model.visual, cache_dir, backend)
        services[backend] = VLModelService(settings, source=source, model=model).start()
    baseline = Baseline(model, tok, model_dir)
    images = workload_images(quick)
    variants = [("baseline", baseline, "cold"), ("torch", Ours(services["torch"], "torch"), "cold"),
                ("onnx-fp32", Ours(services["onnx-fp32"], "onnx-fp32"), "cold")]
    int8 = Ours(services["onnx-int8"], "onnx-int8")
    results: dict = {wl: {} for wl in WORKLOADS}
    for wl, spec in WORKLOADS.items():
        for i in range(runs + 1):  # run 0 warms every path up and is not counted
            img = images[wl][i % len(images[wl])]
            record = []
            for name, v, _ in variants:
                record.append((name, v.run(img, spec["prompt"], tokens)))
            cold = int8.run(img, spec["prompt"], tokens)
            record.append(("onnx-int8 cold", cold))
            record.append(("onnx-int8 repeat", int8.run(img, spec["prompt"], tokens)))
            record.append(("onnx-int8 warm", int8.run(img, "What is in this picture?", tokens)))
            record.append(("onnx-int8 follow-up", int8.run(img, "What else can you see?", tokens,
                                                           history=(spec["prompt"], cold["answer"]))))
            if i == 0:
                continue
            for name, r in record:
                results[wl].setdefault(name, []).append(r)
            log.info("%s run %d/%d: %s", wl, i, runs,
                     ", ".join(f"{n} {r['total_ms'] / 1e3:.1f}s" for n, r in record))
    limits = machine_limits(threads, quick)
    prompt_tokens = {wl: int(statistics.median(r["prompt_n"] for r in results[wl]["baseline"])) for wl in WORKLOADS}
    patches = {wl: prompt_tokens[wl] for wl in WORKLOADS}
    from ..engine.media import images as I

    for wl in WORKLOADS:
        p = I.prepare(I.decode(images[wl][0]), services["torch"].spec)
        patches[wl] = p.grid_thw[1] * p.grid_thw[2]
    costs = model_costs(model, prompt_tokens, patches)
    costs["patches"] = patches
    costs["prompt_tokens"] = prompt_tokens
    fidelity = int8_fidelity(services["torch"].encoder, services["onnx-int8"].encoder, images, services["torch"].spec)
    summary = summarise(results, runs)
    onnx_sizes = {k: v.get("file_bytes") for k, v in export.items()}
    report = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores_logical": os.cpu_count(),
                    "threads": threads, "python": platform.python_version(), "torch": torch.__version__},
        "model": {"dir": str(model_dir), "quick": quick, **costs["params"]},
        "build_s": round(build_s, 1), "load_s": round(load_s, 1),
        "export_s": {k: round(v.get("export_s", 0), 1) for k, v in export.items()},
        "quantize_s": round(export.get("onnx-int8", {}).get("quantize_s", 0), 1),
        "onnx_bytes": onnx_sizes, "int8_fidelity": fidelity, "tokens": tokens, "runs": runs,
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "limits": limits, "summary": summary,
        "sizes": {wl: [WORKLOADS[wl]["size"][0] // (4 if quick else 1), WORKLOADS[wl]["size"][1] // (4 if quick else 1)]
                  for wl in WORKLOADS},
        "ceilings": ceilings(summary, limits, costs), "costs": costs,
    }
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    (out / "bench.md").write_text(markdown(report))
    chart(summary, out / "bench.png")
    return report


def int8_fidelity(ref_enc, q_enc, images: dict, spec) -> dict:
    from ..engine.media import images as I

    out = {}
    for wl, imgs in images.items():
        p = I.prepare(I.decode(imgs[0]), spec)
        a, b = ref_enc(p.pixel_values, p.grid_thw), q_enc(p.pixel_values, p.grid_thw)
        rows = {}
        for name, x, y in [("merged", a.embeds, b.embeds)] + [(f"deepstack_{i}", x, y) for i, (x, y) in
                                                               enumerate(zip(a.deepstack, b.deepstack))]:
            cos = (x * y).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1) + 1e-12)
            rows[name] = {"cosine_min": round(float(cos.min()), 5), "cosine_mean": round(float(cos.mean()), 5),
                          "max_abs": round(float(np.abs(x - y).max()), 4)}
        out[wl] = rows
    return out


def _stat(values):
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


def summarise(results: dict, runs: int) -> dict:
    summary = {}
    for wl, by_variant in results.items():
        base = by_variant["baseline"]
        summary[wl] = {}
        for name, rs in by_variant.items():
            row = {k: _stat([r[k] for r in rs]) for k in STAGES + ("ttft_ms", "total_ms", "decode_tps")}
            row["speedup_total"] = _stat([b["total_ms"] / r["total_ms"] for b, r in zip(base, rs)])
            row["speedup_ttft"] = _stat([b["ttft_ms"] / r["ttft_ms"] for b, r in zip(base, rs)])
            row["prompt_n"] = rs[0]["prompt_n"]
            summary[wl][name] = row
    return summary


def ceilings(summary: dict, limits: dict, costs: dict) -> dict:
    bw = limits["bandwidth_gb_s"] * 1e9
    gemm = limits["gemm_gflop_s"] * 1e9
    decode_ceiling = bw / costs["llm_bytes_per_token"]
    out = {"decode_ceiling_tps": round(decode_ceiling, 2)}
    for wl, rows in summary.items():
        vision_floor = costs["vision_flops"][wl] / gemm * 1e3
        prefill_floor = costs["prefill_flops"][wl] / gemm * 1e3
        best_vision = rows["onnx-int8 cold"]["vision_encode_ms"]["median"]
        out[wl] = {
            "vision_floor_ms_fp32": round(vision_floor, 1), "prefill_floor_ms": round(prefill_floor, 1),
            "decode_fraction_of_ceiling": round(rows["onnx-int8 cold"]["decode_tps"]["median"] / decode_ceiling, 2),
            "prefill_fraction_of_floor": round(prefill_floor / rows["onnx-int8 cold"]["prompt_ms"]["median"], 2),
            "vision_fp32_fraction_of_floor": round(vision_floor / rows["onnx-fp32"]["vision_encode_ms"]["median"], 2),
            "vision_int8_vs_fp32_floor": round(vision_floor / best_vision, 2) if best_vision else None,
        }
    return out


def markdown(report: dict) -> str:
    lines = [f"Machine: {report['machine']['cores_logical']} logical cores, {report['machine']['threads']} threads, "
             f"torch {report['machine']['torch']}. Medians of {report['runs']} runs (min-max), "
             f"{report['tokens']} tokens forced, greedy. Ratio = baseline / variant, pair by pair.", ""]
    for wl, rows in report["summary"].items():
        b = rows["baseline"]
        size = report["sizes"][wl]
        lines += [f"### {wl} ({size[1]}x{size[0]}, {b['prompt_n']} prompt tokens)", "", *md_table(
            ["variant", "decode img ms", "preprocess ms", "vision ms", "prefill ms", "first token s", "decode tok/s",
             "end-to-end s", "first-token ratio", "end-to-end ratio"],
            [[name, f"{r['image_decode_ms']['median']:.1f}", f"{r['preprocess_ms']['median']:.1f}",
              f"{r['vision_encode_ms']['median']:.0f}", f"{r['prompt_ms']['median']:.0f}",
              f"{r['ttft_ms']['median'] / 1e3:.2f} ({r['ttft_ms']['min'] / 1e3:.2f}-{r['ttft_ms']['max'] / 1e3:.2f})",
              f"{r['decode_tps']['median']:.2f}",
              f"{r['total_ms']['median'] / 1e3:.2f} ({r['total_ms']['min'] / 1e3:.2f}-{r['total_ms']['max'] / 1e3:.2f})",
              f"{r['speedup_ttft']['median']:.2f}x", f"{r['speedup_total']['median']:.2f}x"]
             for name, r in rows.items()]), ""]
    lim, c = report["limits"], report["ceilings"]
    lines += [f"Limits measured in the same run: memory bandwidth {lim['bandwidth_gb_s']} GB/s (streamed GEMV), "
              f"fp32 GEMM {lim['gemm_gflop_s']} GFLOP/s. Decode ceiling (LLM weights per token / bandwidth): "
              f"{c['decode_ceiling_tps']} tok/s.", ""]
    for wl in report["summary"]:
        w = c[wl]
        lines.append(f"- {wl}: decode at {w['decode_fraction_of_ceiling'] * 100:.0f}% of the bandwidth ceiling; "
                     f"prefill at {w['prefill_fraction_of_floor'] * 100:.0f}% of what torch's fp32 GEMM rate allows "
                     f"({w['prefill_floor_ms']:.0f} ms); ONNX fp32 vision at {w['vision_fp32_fraction_of_floor'] * 100:.0f}% "
                     f"of that rate ({w['vision_floor_ms_fp32']:.0f} ms; above 100% means ONNX Runtime's kernels beat torch.mm).")
    lines += ["", f"Build {report['build_s']} s (once), load {report['load_s']} s, ONNX export "
              f"{report['export_s']} s, INT8 quantisation {report['quantize_s']} s, ONNX bytes {report['onnx_bytes']}, "
              f"peak RSS {report['peak_rss_gib']} GiB.", "", "INT8 encoder vs PyTorch float32:", ""]
    for wl, rows in report["int8_fidelity"].items():
        lines.append(f"- {wl}: " + "; ".join(f"{k} cosine min {v['cosine_min']} mean {v['cosine_mean']}, max abs "
                                             f"{v['max_abs']}" for k, v in rows.items()))
    return "\n".join(lines) + "\n"


def chart(summary: dict, path: Path) -> None:
    """Stacked bars per stage, baseline beside each variant, one group per workload (OpenCV)."""
    import cv2

    colors = {"image_decode_ms": (180, 180, 180), "preprocess_ms": (120, 120, 120),
              "vision_encode_ms": (60, 140, 230), "prompt_ms": (80, 180, 90), "decode_ms": (200, 120, 60)}
    names = list(next(iter(summary.values())).keys())
    bar_w, gap, left, top, height = 38, 10, 90, 90, 420
    width = left + len(summary) * (len(names) * (bar_w + gap) + 60) + 40
    img = np.full((top + height + 150, width, 3), 255, np.uint8)
    longest = max(sum(r[s]["median"] for s in colors) for rows in summary.values() for r in rows.values())
    scale = height / longest
    x = left
    for wl, rows in summary.items():
        cv2.putText(img, wl, (x, top - 25), cv2.FONT_HERSHEY_SIMPLEX, 0.7, (0, 0, 0), 2, cv2.LINE_AA)
        for name in names:
            y = top + height
            for stage, color in colors.items():
                h = int(rows[name][stage]["median"] * scale)
                cv2.rectangle(img, (x, y - h), (x + bar_w, y), color[::-1], -1)
                y -= h
            total = sum(rows[name][s]["median"] for s in colors) / 1e3
            cv2.putText(img, f"{total:.1f}s", (x, y - 6), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
            label_img = np.full((bar_w, 140, 3), 255, np.uint8)
            cv2.putText(label_img, name, (2, 24), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
            rotated = cv2.rotate(label_img, cv2.ROTATE_90_COUNTERCLOCKWISE)
            img[top + height + 5: top + height + 145, x: x + bar_w] = rotated
            x += bar_w + gap
        x += 60
    lx = left
    for stage, color in colors.items():
        cv2.rectangle(img, (lx, 12), (lx + 14, 26), color[::-1], -1)
        cv2.putText(img, stage.replace("_ms", ""), (lx + 18, 25), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1,
                    cv2.LINE_AA)
        lx += 150
    cv2.line(img, (left - 10, top + height), (width - 30, top + height), (0, 0, 0), 1)
    cv2.imwrite(str(path), img)


def extras(out: Path, cache_dir: Path, threads: int, runs: int, quick: bool) -> dict:
    """Checks that need services of their own: the float32 LLM against the opt-in INT8 one (loaded
    from its store under VL_CACHE_DIR, as a server loads it), each on a new image and on a
    follow-up question in the same conversation (KV prefix reuse), one service after the other over
    the same checkpoint; and the first token of an identical request with the result cache off."""
    import gc

    import psutil

    from ..config import Settings
    from ..engine.service import load_service

    model_dir, _ = bench_model(cache_dir, quick)
    images = workload_images(quick)
    report: dict = {"llm": {}, "repeat": {}}
    for quant in ("", "int8"):
        settings = Settings(model=str(model_dir), cache_dir=str(cache_dir), threads=threads, disk_cache_mb=0,
                            result_cache_entries=0, llm_quant=quant, warmup=False)
        svc = load_service(settings)
        ours = Ours(svc, quant or "float32")
        row: dict = {"quantize_s": round(svc.quantize_s, 1), "load_s": round(svc.load_s, 1)}
        for wl, spec in WORKLOADS.items():
            cold, follow = [], []
            for i in range(runs + 1):  # run 0 warms up and is not counted
                img = images[wl][i % len(images[wl])]
                c = ours.run(img, spec["prompt"], 32)
                f = ours.run(img, "What else can you see?", 32, history=(spec["prompt"], c["answer"]))
                if i:
                    cold.append(c)
                    follow.append(f)
            row[wl] = {"prefill_ms": _stat([r["prompt_ms"] for r in cold]),
                       "decode_tps": _stat([r["decode_tps"] for r in cold]),
                       "ttft_ms": _stat([r["ttft_ms"] for r in cold]), "total_ms": _stat([r["total_ms"] for r in cold]),
                       "follow_up_ttft_ms": _stat([r["ttft_ms"] for r in follow]),
                       "prompt_n": cold[-1]["prompt_n"], "follow_up_prompt_n": follow[-1]["prompt_n"],
                       "follow_up_cache_n": follow[-1]["cache_n"]}
        row["rss_gib"] = round(psutil.Process().memory_info().rss / 2**30, 2)
        report["llm"][quant or "float32"] = row
        del ours, svc
        gc.collect()
    settings = Settings(model=str(model_dir), cache_dir=str(cache_dir), threads=threads, disk_cache_mb=0)
    svc = load_service(settings)
    ours = Ours(svc, "repeat")
    for wl in WORKLOADS:
        ours.run(images[wl][0], WORKLOADS[wl]["prompt"], 8)
        report["repeat"][wl] = _stat([ours.run(images[wl][0], WORKLOADS[wl]["prompt"], 8)["ttft_ms"]
                                      for _ in range(runs)])
    (out / "extras.json").write_text(json.dumps(report, indent=2))
    (out / "extras.md").write_text(extras_markdown(report))
    return report


def extras_markdown(report: dict) -> str:
    f, q = report["llm"]["float32"], report["llm"]["int8"]
    lines = md_table(["LLM", "workload", "prefill ms", "decode tok/s", "first token s", "32-token answer s",
                      "follow-up first token s"],
                     [[name, wl, f"{w['prefill_ms']['median']:.0f}", f"{w['decode_tps']['median']:.2f}",
                       f"{w['ttft_ms']['median'] / 1e3:.2f}", f"{w['total_ms']['median'] / 1e3:.2f}",
                       f"{w['follow_up_ttft_ms']['median'] / 1e3:.2f}"]
                      for name, r in report["llm"].items() for wl in WORKLOADS for w in [r[wl]]])
    lines.append("")
    for wl in WORKLOADS:
        a, b = f[wl], q[wl]
        lines.append(f"- {wl}, INT8 / float32: prefill {a['prefill_ms']['median'] / b['prefill_ms']['median']:.1f}x "
                     f"faster, decode {b['decode_tps']['median'] / a['decode_tps']['median']:.1f}x, answer "
                     f"{a['total_ms']['median'] / b['total_ms']['median']:.1f}x, follow-up first token "
                     f"{a['follow_up_ttft_ms']['median'] / b['follow_up_ttft_ms']['median']:.1f}x "
                     f"(follow-up: {b['follow_up_cache_n']} tokens from the conversation's KV cache, "
                     f"{b['follow_up_prompt_n']} computed).")
    lines += [f"- INT8 weights built once and stored: {q['quantize_s']} s (0 when already stored); "
              f"service load {f['load_s']} s float32, {q['load_s']} s INT8.", "",
              "Identical request again (result cache off), first token: " + ", ".join(
                  f"{wl} {v['median']:.1f} ms ({v['min']:.1f}-{v['max']:.1f})" for wl, v in report["repeat"].items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from ..config import Settings

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--decode" in argv:
        from . import decodeprof  # one decode step's time, part by part, beside its kernel floor

        return decodeprof.main([a for a in argv if a != "--decode"])
    if any(a == "--concurrency" or a.startswith("--concurrency=") for a in argv):
        from . import concurrency  # several clients at once, through the real server

        return concurrency.main(argv)
    if "--structured" in argv:
        from . import structured  # the openai client's structured output and forced calls, N requests

        return structured.main([a for a in argv if a != "--structured"])
    if "--constraints" in argv:
        from . import constraintbench  # structured output's and forced tool calls' cost per step

        return constraintbench.main([a for a in argv if a != "--constraints"])
    if "--lowbit" in argv:
        from . import lowbit  # the LLM's weight kernels at 8 and 4 bits, side by side

        return lowbit.main([a for a in argv if a != "--lowbit"])
    if "--prefill" in argv:
        from . import prefillbench  # a photo's prompt through the int4 graph and the INT8 LLM

        return prefillbench.main([a for a in argv if a != "--prefill"])
    if "--video" in argv:
        from . import videobench  # one clip, stage by stage, at two per-frame budgets

        return videobench.main([a for a in argv if a != "--video"])
    if "--replicas" in argv:
        from . import replicas  # two replicas behind nginx, with and without Redis

        return replicas.main([a for a in argv if a != "--replicas"])
    ap = argparse.ArgumentParser(prog="python -m vlservice bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the same code on a tiny checkpoint, in well under a minute")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--render", action="store_true", help="only re-render bench.md/png from --out's bench.json")
    ap.add_argument("--extras", action="store_true",
                    help="only the INT8-LLM and identical-request checks (extras.md/json in --out)")
    ap.add_argument("--concurrency", metavar="N,N,...",
                    help="only several clients at once through the real server (concurrency.md/json/png in --out; "
                         "see python -m vlservice.tools.concurrency --help)")
    ap.add_argument("--decode", action="store_true",
                    help="only one decode step, part by part, beside its kernel floor (decode.md/json in --out; "
                         "see python -m vlservice.tools.decodeprof --help)")
    ap.add_argument("--replicas", action="store_true",
                    help="only two replicas behind nginx, with and without Redis: what affinity and the shared tier "
                         "save (replicas.md/json in --out; see python -m vlservice.tools.replicas --help)")
    ap.add_argument("--lowbit", action="store_true",
                    help="only one decode step's weight products at 8 and 4 bits, every kernel available here "
                         "(lowbit.md/json in --out; see python -m vlservice.tools.lowbit --help)")
    ap.add_argument("--prefill", action="store_true",
                    help="only a photo's prompt through the int4 graph and the INT8 LLM's prefill (prefill.md/json "
                         "in --out; see python -m vlservice.tools.prefillbench --help)")
    ap.add_argument("--video", action="store_true",
                    help="only a 10-second clip through the service at two per-frame budgets: decode, sampling, "
                         "encode, prefill (video.md/json in --out; see python -m vlservice.tools.videobench --help)")
    ap.add_argument("--structured", action="store_true",
                    help="only N image requests through the openai client's parse helper and N forced tool calls "
                         "against the demo model (structured.md/json in --out; python -m vlservice bench --structured "
                         "N)")
    ap.add_argument("--constraints", action="store_true",
                    help="only what grammars cost: compile, the mask per token on the real vocabulary, and the "
                         "masks' share of a decode step at batch 1 and 4 (constraints.md/json in --out)")
    ap.add_argument("--levers", action="store_true",
                    help="only the system settings (allocators, threads, affinity, grayscale): levers.md/json in --out")
    args = ap.parse_args(argv)
    if args.levers:
        from . import levers

        return levers.main(["--runs", str(args.runs), "--out", str(args.out)] + (["--quick"] if args.quick else []))
    if args.extras:
        settings = Settings.from_env()
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        args.out.mkdir(parents=True, exist_ok=True)
        extras(args.out, settings.cache_path, settings.num_threads, args.runs, args.quick)
        print((args.out / "extras.md").read_text())
        return 0
    if args.render:
        report = json.loads((args.out / "bench.json").read_text())
        (args.out / "bench.md").write_text(markdown(report))
        chart(report["summary"], args.out / "bench.png")
        print((args.out / "bench.md").read_text())
        return 0
    settings = Settings.from_env()
    if args.quick:
        args.tokens = min(args.tokens, 8)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    report = run(args.out, args.runs, args.tokens, args.quick, settings.cache_path, settings.num_threads)
    print((args.out / "bench.md").read_text())
    print(f"wrote {args.out / 'bench.json'}, {args.out / 'bench.md'}, {args.out / 'bench.png'}")
    return 0 if report else 1


if __name__ == "__main__":
    raise SystemExit(main())
