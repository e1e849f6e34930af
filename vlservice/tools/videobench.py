"""`python -m vlservice bench --video`: one clip through the service, stage by stage.

A 10-second clip (640x360, 30 fps, VP9 in WebM as a browser records it; MPEG-4 Part 2 in MP4
where this OpenCV cannot write VP9) is drawn with OpenCV: a shape crossing a gradient, a counter
that changes every second. It is asked about through `VLModelService.submit`, as the API asks,
at two per-frame pixel budgets: the default (`detail: auto`, `VL_VIDEO_DETAIL_AUTO_PIXELS`) and
a lower one (224 x 224 px per frame, the budget Qwen's own video examples use; set here as the
`low` budget). For each: the video token count and sampled frames, and the medians of the
service's own timings: container decode (FFmpeg through OpenCV), sampling and resize (frame
choice, one resize for all frames, normalise, patchify), vision encode (ONNX Runtime, the
server's default INT8 encoder unless `VL_VISION_BACKEND` says otherwise), prefill of the whole prompt
(video tokens and question), the first token, and decode speed over `--tokens` forced tokens.
Feature, KV and result caches are off, so every run encodes and prefills the clip anew.

Every output names the CPU; compare only numbers from one run.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SECONDS, FPS, SIZE = 10, 30, (640, 360)
LOW_PIXELS = 224 * 224
QUESTION = "Describe this video."
STAGES = ("video_decode_ms", "video_preprocess_ms", "vision_encode_ms", "prompt_ms", "ttft_ms")


def make_clip(seconds: int = SECONDS, fps: int = FPS, size: tuple[int, int] = SIZE) -> tuple[bytes, str]:
    """(file bytes, media type) of a drawn clip: VP9/WebM, else MPEG-4/MP4."""
    import cv2
    import numpy as np

    w, h = size
    ramp = np.linspace(40, 200, w, dtype=np.float32)
    background = np.stack([np.tile(ramp, (h, 1)), np.full((h, w), 90, np.float32),
                           np.tile(ramp[::-1], (h, 1))], axis=-1).astype(np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        for fourcc, ext, media in (("VP90", "webm", "video/webm"), ("mp4v", "mp4", "video/mp4")):
            path = Path(tmp) / f"clip.{ext}"
            writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, size)
            if not writer.isOpened():
                continue
            for i in range(seconds * fps):
                frame = background.copy()
                x = int(40 + (w - 80) * i / (seconds * fps - 1))
                cv2.circle(frame, (x, h // 2), h // 8, (40, 40, 230), -1, cv2.LINE_AA)
                cv2.putText(frame, str(i // fps), (20, 60), cv2.FONT_HERSHEY_SIMPLEX, 1.6, (255, 255, 255), 3,
                            cv2.LINE_AA)
                writer.write(frame)
            writer.release()
            data = path.read_bytes()
            if data:
                return data, media
    raise RuntimeError("this OpenCV can write neither VP9 nor MPEG-4 video")


def measure(svc, clip: bytes, detail: str, runs: int, tokens: int) -> dict:
    from ..engine.types import ChatRequest, Message, Sampling, VideoInput

    rows = []
    for _ in range(runs):
        request = ChatRequest(messages=[Message("user", [VideoInput(clip, detail=detail), QUESTION])],
                              sampling=Sampling(max_tokens=tokens, min_tokens=tokens, temperature=0.0),
                              result_cache=False)
        rows.append(svc.chat(request)["timings"])
    first = rows[0]
    out = {"runs": runs, "video_frames": first["video_frames"], "video_tokens": first["video_tokens"],
           "prompt_tokens": first["prompt_n"]}
    for key in STAGES:
        out[key] = round(statistics.median(r[key] for r in rows), 1)
    out["decode_tps"] = round(statistics.median(r["predicted_per_second"] for r in rows), 2)
    out["prefill_tps"] = round(out["prompt_tokens"] / out["prompt_ms"] * 1e3, 1) if out["prompt_ms"] else None
    return out


def run(model_dir: Path, runs: int, tokens: int, llm: str, cache_dir: Path) -> dict:
    from ..config import Settings
    from ..engine.service import VLModelService

    clip, media = make_clip()
    settings = Settings.from_env(model=str(model_dir), llm_quant="" if llm == "float32" else llm,
                                 result_cache_entries=0, kv_cache_mb=0, disk_cache_mb=0, feature_cache_mb=0,
                                 video_detail_low_pixels=LOW_PIXELS, cache_dir=str(cache_dir))
    svc = VLModelService(settings).start()
    try:
        budgets = {}
        for detail, pixels in (("auto", settings.video_detail_auto_pixels), ("low", LOW_PIXELS)):
            row = measure(svc, clip, detail, runs, tokens)
            row["frame_pixels"] = pixels
            budgets[detail] = row
            log.info("video, %s (%d px per frame): %s", detail, pixels, row)
        return {"clip": {"seconds": SECONDS, "fps": FPS, "size": list(SIZE), "media": media, "bytes": len(clip)},
                "llm": llm, "vision": svc.encoder.name,
                "tokens": tokens, "budgets": budgets}
    finally:
        svc.close()


def markdown(report: dict) -> str:
    from .harness import md_table

    cpu, clip = report["cpu"], report["clip"]
    lines = [f"*{cpu['model']} ({', '.join(cpu['flags']) or 'no AVX-512'}), {cpu['threads']} threads; a "
             f"{clip['seconds']} s {clip['size'][0]}x{clip['size'][1]} clip at {clip['fps']} fps ({clip['media']}, "
             f"{clip['bytes'] // 1024} KiB), frames sampled at 2 fps; {report['llm']} LLM, {report['vision']} vision; "
             f"medians of {report['runs']} runs, caches off; decode over {report['tokens']} forced tokens.*", ""]
    names = {"auto": "default (`auto`, {:,} px)", "low": "224 x 224 ({:,} px)"}
    lines += md_table(["per-frame budget", "frames", "video tokens", "prompt tokens", "decode (FFmpeg)",
                       "sample + resize + patchify", "vision encode", "prefill", "prefill tok/s",
                       "first token after sampling", "decode tok/s"],
                      [[names[detail].format(r["frame_pixels"]), r["video_frames"], f"{r['video_tokens']:,}",
                        f"{r['prompt_tokens']:,}", f"{r['video_decode_ms']:.0f} ms", f"{r['video_preprocess_ms']:.0f} ms",
                        f"{r['vision_encode_ms'] / 1e3:.2f} s", f"{r['prompt_ms'] / 1e3:.2f} s", r["prefill_tps"],
                        f"{r['ttft_ms'] / 1e3:.2f} s", r["decode_tps"]] for detail, r in report["budgets"].items()])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from .harness import start_report

    ap = argparse.ArgumentParser(prog="python -m vlservice bench --video", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--llm", default="float32", choices=("float32", "int8"))
    ap.add_argument("--quick", action="store_true", help="the same code on a tiny checkpoint")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    settings, model_dir, report = start_report(args)
    report.update({"runs": args.runs}, **run(model_dir, args.runs, args.tokens, args.llm, settings.cache_path))
    (args.out / "video.json").write_text(json.dumps(report, indent=2))
    (args.out / "video.md").write_text(markdown(report))
    print((args.out / "video.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
