"""Accuracy of the demo model on held-out generated images, per task and per vision path.

`python -m vlservice eval-demo [--model DIR] [--n 200] [--seed 999]` answers the same held-out
questions (a seed the training never used) greedily through the serving engine with the PyTorch
vision encoder, ONNX fp32, ONNX INT8, and INT8 again through the feature cache, and prints a
Markdown table of exact-match accuracy per task, plus how often onnx-fp32's answer equals
PyTorch's. `--json` writes the numbers too.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

from .data import TASKS, encode_png, iter_samples

BACKENDS = ("torch", "onnx-fp32", "onnx-int8")


def normalise(text: str) -> str:
    return " ".join(text.strip().split())


def run(model_dir: Path, n: int, seed: int, cache_dir: Path, threads: int = 0) -> dict:
    from ..config import Settings
    from ..generate import Sampling
    from ..service import ChatRequest, ImageInput, Message, load_service

    samples = list(iter_samples(seed, n))
    answers: dict[str, list[str]] = {}
    for backend in BACKENDS:
        settings = Settings(model=str(model_dir), cache_dir=str(cache_dir), vision_backend=backend,
                            threads=threads, disk_cache_mb=0)
        svc = load_service(settings)
        for run_name in ([backend, backend + "+cache"] if backend == "onnx-int8" else [backend]):
            out = []
            for s in samples:
                req = ChatRequest([Message("user", [ImageInput(encode_png(s.image)), s.question])],
                                  Sampling(max_tokens=48))
                out.append(svc.chat(req)["text"])
            answers[run_name] = out
        del svc
    table: dict = {}
    for run_name, out in answers.items():
        per = defaultdict(lambda: [0, 0])
        for s, a in zip(samples, out):
            per[s.task][0] += normalise(a) == normalise(s.answer)
            per[s.task][1] += 1
        table[run_name] = {t: per[t][0] / per[t][1] for t in TASKS if per[t][1]}
        table[run_name]["all"] = sum(v[0] for v in per.values()) / len(samples)
    same = sum(a == b for a, b in zip(answers["torch"], answers["onnx-fp32"])) / len(samples)
    counts = defaultdict(int)
    for s in samples:
        counts[s.task] += 1
    examples = [{"task": s.task, "lang": s.lang, "question": s.question, "expected": s.answer,
                 "int8": answers["onnx-int8"][i]} for i, s in enumerate(samples[:12])]
    return {"n": n, "seed": seed, "accuracy": table, "fp32_equals_torch": same, "counts": dict(counts),
            "examples": examples}


def markdown(result: dict) -> str:
    tasks = [t for t in TASKS if t in result["counts"]]
    head = "| vision path | " + " | ".join(f"{t} (n={result['counts'][t]})" for t in tasks) + " | all |"
    lines = [head, "|" + "---|" * (len(tasks) + 2)]
    for run_name, acc in result["accuracy"].items():
        lines.append(f"| {run_name} | " + " | ".join(f"{acc[t] * 100:.1f}%" for t in tasks)
                     + f" | {acc['all'] * 100:.1f}% |")
    lines.append(f"\nonnx-fp32 answers identical to PyTorch's: {result['fp32_equals_torch'] * 100:.1f}% "
                 f"of {result['n']} held-out images (seed {result['seed']}).")
    return "\n".join(lines)


def main(argv=None) -> int:
    from ..models import bundled_demo_path

    ap = argparse.ArgumentParser(prog="python -m vlservice eval-demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=bundled_demo_path())
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=999)
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers to this file")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.model, args.n, args.seed, args.cache_dir or Path(tmp))
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
