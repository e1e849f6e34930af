"""`python -m vlservice.tools.memtrend --requests 4000`: does the engine's memory level off?

Runs chat requests through one in-process `VLModelService` (the model named by `VL_MODEL`, default
the demo; caches bounded small so they fill early), half of them with a new image and half with one
of 40 repeated images, and prints the process RSS every 500 requests. A leak grows without end;
native caches (ONNX Runtime's arena, oneDNN's primitives, the allocator) grow and then level off.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time

import cv2
import numpy as np
import psutil


def _image(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    img = np.full((120, 160, 3), rng.integers(150, 240, 3), dtype=np.uint8)
    for _ in range(3):
        cv2.circle(img, (int(rng.integers(0, 160)), int(rng.integers(0, 120))), int(rng.integers(4, 40)),
                   tuple(int(c) for c in rng.integers(0, 255, 3)), -1, cv2.LINE_AA)
    return cv2.imencode(".png", img)[1].tobytes()


def main(argv=None) -> int:
    from ..config import Settings
    from ..engine.types import Sampling
    from ..engine.types import ChatRequest, ImageInput, Message
    from ..engine.service import load_service

    ap = argparse.ArgumentParser(prog="python -m vlservice.tools.memtrend", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--every", type=int, default=500)
    args = ap.parse_args(argv)
    base = Settings.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        svc = load_service(base.with_(model=base.model or "demo", cache_dir=tmp, disk_cache_mb=0,
                                      feature_cache_mb=16, kv_cache_mb=32))
        proc, t0 = psutil.Process(), time.time()
        print("| requests | RSS MiB | seconds |\n|---:|---:|---:|")
        points = []
        for i in range(args.requests + 1):
            img = _image(5000 + i) if i % 2 else _image(i % 40)
            svc.chat(ChatRequest([Message("user", [ImageInput(img), f"Describe {i % 7}"])], Sampling(max_tokens=16),
                                 result_cache=False))
            if i % args.every == 0:
                gc.collect()
                rss = proc.memory_info().rss / 2**20
                points.append((i, rss))
                print(f"| {i} | {rss:.0f} | {time.time() - t0:.0f} |", flush=True)
    late = [p for p in points if p[0] >= args.requests / 2]
    if len(late) >= 2:
        slope = statistics.linear_regression([p[0] for p in late], [p[1] for p in late]).slope * 1000
        trim = "on" if svc.settings.malloc_trim else "off"
        print(f"\nsecond half: {slope:+.1f} MiB per 1000 requests (malloc_trim {trim})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
