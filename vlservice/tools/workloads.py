"""What the benchmarks feed the service: photo- and document-like images, the real-size random
checkpoint (built once), and `Ours`, one timed request through `VLModelService`."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

WORKLOADS = {
    "photo": {"size": (448, 448), "prompt": "Describe this image."},
    "document": {"size": (768, 1024), "prompt": "Read all the text in this image."},
}

# --------------------------------------------------------------------------- inputs

def photo_like(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients, blobs and texture: compresses and encodes like a photo."""
    import cv2

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([120 + 80 * np.sin(x / 57 + c) * np.cos(y / 43 - c) for c in (0.0, 1.3, 2.6)], -1)
    for _ in range(12):
        c = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        cv2.circle(img, c, int(rng.integers(10, h // 4)), tuple(float(v) for v in rng.integers(0, 255, 3)), -1,
                   cv2.LINE_AA)
    img += rng.normal(0, 6, img.shape)
    return np.clip(cv2.GaussianBlur(img, (0, 0), 1.2), 0, 255).astype(np.uint8)


def document_like(h: int, w: int, seed: int = 0) -> np.ndarray:
    import cv2

    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 248, np.uint8)
    words = ["invoice", "total", "amount", "date", "service", "CPU", "report", "quarter", "2026", "items",
             "summary", "page", "net", "tax", "order", "customer"]
    y = 60
    while y < h - 40:
        line = " ".join(rng.choice(words, int(rng.integers(4, 9))))
        cv2.putText(img, line, (50, y), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (20, 20, 20), 2, cv2.LINE_AA)
        y += int(rng.integers(34, 46))
    return img


def encode_jpeg(rgb: np.ndarray) -> bytes:
    import cv2

    return cv2.imencode(".jpg", rgb[:, :, ::-1].copy(), [cv2.IMWRITE_JPEG_QUALITY, 92])[1].tobytes()


def workload_images(quick: bool) -> dict:
    out = {}
    for name, wl in WORKLOADS.items():
        h, w = wl["size"]
        if quick:
            h, w = h // 4, w // 4
        maker = photo_like if name == "photo" else document_like
        out[name] = [encode_jpeg(maker(h, w, seed=s)) for s in range(8)]  # a new image per cold run
    return out


# --------------------------------------------------------------------------- model

def bench_model(cache_dir: Path, quick: bool) -> tuple[Path, float]:
    from ..build.checkpoints import REAL, TINY, make_model

    folder = cache_dir / ("bench-model-tiny" if quick else "bench-model")
    if (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file():
        return folder, 0.0
    t0 = time.perf_counter()
    log.info("building the %s random-weight checkpoint in %s (once)", "tiny" if quick else "real-size", folder)
    make_model(folder, TINY if quick else REAL, seed=1234)
    return folder, time.perf_counter() - t0


# --------------------------------------------------------------------------- ours

class Ours:
    def __init__(self, service, name: str):
        self.service, self.name = service, name

    def run(self, image: bytes, prompt: str, tokens: int, history=None) -> dict:
        from ..engine.types import ChatRequest, ImageInput, Message, Sampling

        msgs = [Message("user", [ImageInput(image), prompt])]
        if history:
            msgs = [Message("user", [ImageInput(image), history[0]]), Message("assistant", [history[1]]),
                    Message("user", [prompt])]
        t0 = time.perf_counter()
        r = self.service.chat(ChatRequest(msgs, Sampling(max_tokens=tokens, min_tokens=tokens), result_cache=False))
        total = (time.perf_counter() - t0) * 1e3
        t = r["timings"]
        return {"image_decode_ms": t["image_decode_ms"], "preprocess_ms": t["preprocess_ms"],
                "vision_encode_ms": t["vision_encode_ms"], "prompt_ms": t["prompt_ms"], "ttft_ms": t["ttft_ms"],
                "decode_ms": t["predicted_ms"], "total_ms": total, "decode_tps": t["predicted_per_second"],
                "prompt_n": t["prompt_n"], "cache_n": t.get("cache_n", 0), "predicted_n": t["predicted_n"],
                "answer": r["text"],
                "cache_hit": t["vision_cache_hit"]}
