"""`python -m vlservice compare --images DIR`: two configurations, the same questions, your images.

Quantisation (an INT8 LLM, an INT8 vision encoder) changes numbers; whether it changes answers on
*your* pictures with the *real* weights is something only a run on them can tell. This answers
every question about every image greedily with configuration A and with configuration B and
reports how often the answers are identical, how many leading tokens agree, and the speed ratio.

Configurations are `KEY=VALUE` settings over the environment's (`VL_*` names without the prefix,
for example `--a vision_backend=torch --b vision_backend=onnx-int8`, or the default: float32 LLM
against `llm_quant=int8`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

DEFAULT_QUESTIONS = ("Describe this image.", "Read all the text in this image.")
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif"}


def configuration(pairs: list[str]):
    """The environment's settings with `pairs` over them, parsed like the environment itself
    (`warmup=false` is False) and validated; caches that would answer B from A's work are off.
    ValueError names an unknown key or a bad value."""
    from ..config import Settings

    quiet = {"disk_cache_mb": 0, "result_cache_entries": 0, "kv_cache_mb": 0}
    return Settings.from_env(**{**quiet, **Settings.parse_overrides(pairs)})


def _leading_agreement(a: list[int], b: list[int]) -> float:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n / max(len(a), len(b), 1)


def run(images: list[Path], questions, a_pairs, b_pairs, max_tokens: int) -> dict:
    from ..engine.types import Sampling
    from ..engine.types import ChatRequest, ImageInput, Message
    from ..engine.service import load_service

    configs = {"A": configuration(a_pairs), "B": configuration(b_pairs)}  # both checked before any load
    results = {}
    for label, pairs in (("A", a_pairs), ("B", b_pairs)):
        svc = load_service(configs[label])
        rows = []
        for path in images:
            data = path.read_bytes()
            for q in questions:
                t0 = time.perf_counter()
                r = svc.chat(ChatRequest([Message("user", [ImageInput(data, param=str(path)), q])],
                                         Sampling(max_tokens=max_tokens)))
                rows.append({"image": path.name, "question": q, "answer": r["text"],
                             "tokens": svc.tokenizer(r["text"], add_special_tokens=False)["input_ids"],
                             "seconds": time.perf_counter() - t0})
        results[label] = {"settings": pairs, "rows": rows}
        del svc
    a, b = results["A"]["rows"], results["B"]["rows"]
    same = [x["answer"] == y["answer"] for x, y in zip(a, b)]
    agree = [_leading_agreement(x["tokens"], y["tokens"]) for x, y in zip(a, b)]
    speed = [x["seconds"] / y["seconds"] for x, y in zip(a, b)]
    return {
        "a": a_pairs, "b": b_pairs, "pairs": len(a),
        "exact_match": sum(same) / len(same), "leading_token_agreement": statistics.mean(agree),
        "speedup_of_b": statistics.median(speed),
        "differences": [{"image": x["image"], "question": x["question"], "a": x["answer"], "b": y["answer"]}
                        for x, y, s in zip(a, b, same) if not s],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vlservice compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, required=True, help="a folder of images (or one image)")
    ap.add_argument("--question", action="append", help="a question (repeatable); default: describe and OCR")
    ap.add_argument("--a", nargs="*", default=[], metavar="KEY=VALUE", help="configuration A (default: as set)")
    ap.add_argument("--b", nargs="*", default=["llm_quant=int8"], metavar="KEY=VALUE", help="configuration B")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    for pairs in (args.a, args.b):
        try:
            configuration(pairs)
        except ValueError as exc:
            ap.error(str(exc))  # exit 2, before any model loads
    paths = [args.images] if args.images.is_file() else sorted(
        p for p in args.images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        ap.error(f"no images in {args.images}")
    report = run(paths, tuple(args.question or DEFAULT_QUESTIONS), args.a, args.b, args.max_tokens)
    print(f"A: {' '.join(args.a) or '(environment)'}   B: {' '.join(args.b)}")
    print(f"{report['pairs']} answers: identical {report['exact_match'] * 100:.1f}%, leading tokens agreeing "
          f"{report['leading_token_agreement'] * 100:.1f}%, B is {report['speedup_of_b']:.2f}x as fast as A")
    for d in report["differences"][:10]:
        print(f"- {d['image']} / {d['question']}\n  A: {d['a'][:120]!r}\n  B: {d['b'][:120]!r}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
