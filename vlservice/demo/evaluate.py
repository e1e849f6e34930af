"""Accuracy of the demo model on held-out generated images, per task and per vision path.

`python -m vlservice eval-demo [--model DIR] [--n 200] [--seed S]` answers the same held-out
questions greedily through the serving engine with the PyTorch vision encoder, ONNX fp32, ONNX
INT8, and INT8 again through the feature cache (KV and result caches off, so every answer is
computed), with `--llm-int8` also with the INT8 LLM, and prints a Markdown table of exact-match
accuracy per task, plus how often onnx-fp32's answer equals PyTorch's. `--json` writes the numbers.

Two held-out seeds, because a number is only a fair estimate if nothing was chosen by looking at it:

- DEV_SEED (999) is the development set. The recipe's decisions were made on it (the
  continuations' `--focus` tasks were picked from its first 200 images, the aids were compared on
  it), so its accuracy is optimistic. Use `--seed 999` while choosing anything.
- REPORT_SEED (7919, the default) is the report set, picked after the recipe was fixed: the
  README's table and the target test use it, and nothing is tuned on it.

Neither is a training seed. Training draws every image from `np.random.default_rng(seed)` of its
`--seed` (the shipped recipe: 0-4, recorded in its `training.json`), the held-out sets from
`default_rng(999)` and `default_rng(7919)`; NumPy seeds each generator through `SeedSequence`, so
the streams are independent and an image is shared only by an exact coincidence of every draw
(size, colours, positions, noise, font scale). `train-demo` refuses these two seeds, and
tests/unit/test_demo_seeds.py checks the report images against a prefix of every recorded training
run. (The tokenizer's vocabulary comes from the question and answer texts of seed 12345; the texts
are a small closed set that every split shares by design, the images are what is held out.)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

from .data import TASKS, encode_png, iter_samples

BACKENDS = ("torch", "onnx-fp32", "onnx-int8")
DEV_SEED = 999  # decisions were made on it (see the docstring)
REPORT_SEED = 7919  # the reported numbers; never used to choose anything
HELD_OUT_SEEDS = (DEV_SEED, REPORT_SEED)


# "ocr_short": the reading questions whose text has at most six characters (the target's scope).
COLUMNS = (*TASKS, "ocr_short")


def _scored_as(sample) -> tuple[str, ...]:
    if sample.task == "ocr" and len(sample.answer) <= 6:
        return sample.task, "ocr_short"
    return (sample.task,)


def normalise(text: str) -> str:
    return " ".join(text.strip().split())


def run(model_dir: Path, n: int, seed: int, cache_dir: Path, threads: int = 0, backends=BACKENDS,
        llm_int8: bool = False, batched: int = 0, plain_fp32: bool = False, sets_n: int = 0,
        llm_int4: bool = False) -> dict:
    """`batched` > 1: every question is also asked `batched` at a time (decoded together in one
    batch) and the answers are compared with those given one at a time. `plain_fp32`: also answer
    with the float32 LLM's plain `nn.Linear` weights (VL_LLM_PREPACK=false) and compare with the
    prepacked default. `sets_n` > 0: the first vision path also answers that many questions of each
    of `heldout.SETS` (held-out phrasings, out-of-style pictures, grounding boxes)."""
    from ..config import Settings
    from ..engine.service import load_service
    from ..engine.types import ChatRequest, ImageInput, Message, Sampling

    samples = list(iter_samples(seed, n))
    answers: dict[str, list[str]] = {}
    same_batched: dict[str, float] = {}
    sets: dict = {}

    def ask(s):
        return ChatRequest([Message("user", [ImageInput(encode_png(s.image)), s.question])],
                           Sampling(max_tokens=48), result_cache=False)

    runs = [(b, {"vision_backend": b}) for b in backends]
    if llm_int8:
        runs.append(("onnx-int8+llm-int8", {"vision_backend": "onnx-int8", "llm_quant": "int8"}))
    if llm_int4:
        runs.append(("onnx-int8+llm-int4", {"vision_backend": "onnx-int8", "llm_quant": "int4"}))
    if plain_fp32:
        runs.append(("onnx-int8+plain-fp32", {"vision_backend": "onnx-int8", "llm_prepack": False}))
    for name, overrides in runs:
        # KV and result caches off: every answer is computed; the "+cache" pass reads the image
        # features from the feature cache filled by the first pass.
        settings = Settings(model=str(model_dir), cache_dir=str(cache_dir), threads=threads, disk_cache_mb=0,
                            kv_cache_mb=0, result_cache_entries=0, max_batch=max(batched, 1),
                            queue_size=max(batched, 8), **overrides)
        svc = load_service(settings)
        for run_name in ([name, name + "+cache"] if name == "onnx-int8" else [name]):
            out = []
            for s in samples:
                out.append(svc.chat(ask(s))["text"])
            answers[run_name] = out
            if batched > 1 and not run_name.endswith("+cache"):
                together = []
                for i in range(0, len(samples), batched):
                    gens = [svc.submit(ask(s)) for s in samples[i:i + batched]]
                    together += [g.result()["text"] for g in gens]
                same_batched[run_name] = sum(a == b for a, b in zip(out, together)) / len(samples)
        if sets_n and name == runs[0][0]:
            from .heldout import run_sets

            sets = run_sets(svc, seed, sets_n)
        svc.close()
        del svc
    table: dict = {}
    for run_name, out in answers.items():
        per = defaultdict(lambda: [0, 0])
        for s, a in zip(samples, out):
            for task in _scored_as(s):
                per[task][0] += normalise(a) == normalise(s.answer)
                per[task][1] += 1
        table[run_name] = {t: per[t][0] / per[t][1] for t in COLUMNS if per[t][1]}
        table[run_name]["all"] = sum(per[t][0] for t in TASKS) / len(samples)
    plain_same = None
    if "onnx-int8+plain-fp32" in answers and "onnx-int8" in answers:
        plain_same = sum(a == b for a, b in zip(answers["onnx-int8"], answers["onnx-int8+plain-fp32"])) / len(samples)
    same = None
    if "torch" in answers and "onnx-fp32" in answers:
        same = sum(a == b for a, b in zip(answers["torch"], answers["onnx-fp32"])) / len(samples)
    counts = defaultdict(int)
    for s in samples:
        for task in _scored_as(s):
            counts[task] += 1
    examples = [{"task": s.task, "lang": s.lang, "question": s.question, "expected": s.answer,
                 "answer": answers[list(answers)[-1]][i]} for i, s in enumerate(samples[:12])]
    return {"n": n, "seed": seed, "accuracy": table, "fp32_equals_torch": same, "counts": dict(counts),
            "batched": batched, "batched_equals_alone": same_batched, "sets": sets, "prepacked_equals_plain": plain_same,
            "examples": examples}


def markdown(result: dict) -> str:
    tasks = [t for t in COLUMNS if t in result["counts"]]
    names = {"ocr": "ocr (all)", "ocr_short": "ocr (<= 6 chars)"}
    head = "| vision path | " + " | ".join(f"{names.get(t, t)} (n={result['counts'][t]})" for t in tasks) + " | all |"
    lines = [head, "|" + "---|" * (len(tasks) + 2)]
    for run_name, acc in result["accuracy"].items():
        lines.append(f"| {run_name} | " + " | ".join(f"{acc[t] * 100:.1f}%" for t in tasks)
                     + f" | {acc['all'] * 100:.1f}% |")
    for run_name, same in result.get("batched_equals_alone", {}).items():
        lines.append(f"\n{run_name}: answers asked {result['batched']} at a time identical to those asked alone: "
                     f"{same * 100:.1f}%")
    if result.get("prepacked_equals_plain") is not None:
        lines.append(f"\nprepacked float32 LLM answers identical to plain nn.Linear's: "
                     f"{result['prepacked_equals_plain'] * 100:.1f}% of {result['n']} held-out images (seed {result['seed']}).")
    if result["fp32_equals_torch"] is not None:
        lines.append(f"\nonnx-fp32 answers identical to PyTorch's: {result['fp32_equals_torch'] * 100:.1f}% "
                     f"of {result['n']} held-out images (seed {result['seed']}).")
    if result.get("sets"):
        from .heldout import markdown as sets_markdown

        lines.append("\n" + sets_markdown(result["sets"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    from ..engine.model.checkpoints import bundled_demo_path

    ap = argparse.ArgumentParser(prog="python -m vlservice eval-demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=bundled_demo_path())
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=REPORT_SEED,
                    help=f"held-out images: {REPORT_SEED} reports (default), {DEV_SEED} is for development decisions")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS,
                    help="vision paths to measure (onnx-int8 also runs through the feature cache)")
    ap.add_argument("--llm-int8", action="store_true", help="also answer with the INT8 LLM (VL_LLM_QUANT=int8)")
    ap.add_argument("--llm-int4", action="store_true", help="also answer with 4-bit decoding (VL_LLM_QUANT=int4)")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers to this file")
    ap.add_argument("--batched", type=int, default=0, metavar="N",
                    help="also ask N questions at a time and report how often the answers equal those given alone")
    ap.add_argument("--plain-fp32", action="store_true",
                    help="also answer with plain float32 linears (VL_LLM_PREPACK=false) and report how often the "
                         "prepacked default gives the same answer")
    ap.add_argument("--sets-n", type=int, default=None, metavar="N",
                    help="questions per held-out phrasing / out-of-style set (default: --n; 0 skips them)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.model, args.n, args.seed, args.cache_dir or Path(tmp), backends=args.backends,
                     llm_int8=args.llm_int8, llm_int4=args.llm_int4, batched=args.batched, plain_fp32=args.plain_fp32,
                     sets_n=args.n if args.sets_n is None else args.sets_n)
    print(markdown(result))
    if args.json:
        from ..config import Settings
        from ..obs.records import cpu_info, run_record

        result.update(cpu=cpu_info(Settings().num_threads), **run_record())
        args.json.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
