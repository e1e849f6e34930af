"""`python -m vlservice bench --prefill`: a photo's prompt through each LLM's prefill, side by side.

Where a new photo's first token goes, after the vision encoder: the prompt's prefill. This times
one image-shaped prompt (`--tokens` positions, the middle ones image tokens with deepstack
features, as a 448x448 photo gives) through the int4 runner (the whole language model as one ONNX
Runtime graph over 4-bit weights, `engine/ortdecode.py`) and through PyTorch's INT8 `LeanLM`
(fbgemm, `VL_LLM_QUANT=int8`: what the int4 setting used for prompts before it became one model),
one after the other in one process, on the same inputs. Medians of `--reps` after one warm-up.
Inputs are random (a kernel's speed does not depend on the values); every output names the CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

log = logging.getLogger(__name__)

IMAGE_TOKENS = 196  # a 448x448 photo


def _timed(lm, inputs, tokens: int, reps: int) -> float:
    import torch

    times = []
    with torch.inference_mode():
        for _ in range(reps + 1):
            kv = lm.new_kv(tokens + 8)
            t = time.perf_counter()
            lm.prefill(kv, *inputs)
            times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def measure(model_dir: Path, cache_dir: Path, tokens: int, reps: int, threads: int) -> dict:
    import torch

    from ..engine.lm import LeanLM
    from ..engine.ortdecode import OrtLM, ensure_decoder
    from ..engine.quant import fuse_int8_projections, load_embedding_model, load_int8_model, make_rows_independent

    torch.set_num_threads(threads)
    frame = load_embedding_model(model_dir, False)
    text = frame.model.language_model
    hidden, image = text.config.hidden_size, min(IMAGE_TOKENS, tokens - 2)
    gen = torch.Generator().manual_seed(0)
    embeds = torch.randn(1, tokens, hidden, generator=gen) * 0.02
    positions = torch.arange(tokens).view(1, 1, tokens).expand(3, 1, tokens).contiguous()
    mask = torch.zeros(1, tokens, dtype=torch.bool)
    mask[0, 1:1 + image] = True
    levels = len(frame.config.vision_config.deepstack_visual_indexes)
    deepstack = [torch.randn(image, hidden, generator=gen) * 0.02 for _ in range(levels)]
    inputs = (embeds, positions, mask, deepstack)
    graph, _ = ensure_decoder(model_dir, cache_dir)
    out = {"int4 (ONNX Runtime, 4-bit graph)": _timed(OrtLM(graph, text.embed_tokens, text.config, threads),
                                                      inputs, tokens, reps)}
    model, _ = load_int8_model(model_dir, cache_dir, False)
    make_rows_independent(model)
    fuse_int8_projections(model)
    out["INT8 (PyTorch fbgemm, LeanLM)"] = _timed(LeanLM(model), inputs, tokens, reps)
    return {name: round(s, 3) for name, s in out.items()}


def markdown(report: dict) -> str:
    from .harness import md_table

    cpu = report["cpu"]
    rows = [[name, f"{s:.2f}", f"{report['tokens'] / s:.0f}"] for name, s in report["prefill_s"].items()]
    return "\n".join([f"*{cpu['model']} ({', '.join(cpu['flags']) or 'no AVX-512'}), {cpu['threads']} threads; "
                      f"one prompt of {report['tokens']} positions ({min(IMAGE_TOKENS, report['tokens'] - 2)} "
                      f"of them image tokens with deepstack features) on {'a tiny' if report['quick'] else 'the real'}"
                      f" model's shapes; medians of {report['reps']}.*", "",
                      *md_table(["LLM", "prefill s", "tokens/s"], rows)]) + "\n"


def main(argv=None) -> int:
    from ..config import Settings
    from .harness import cpu_info, run_record
    from .workloads import bench_model

    ap = argparse.ArgumentParser(prog="python -m vlservice bench --prefill", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=210, help="prompt positions (a 448x448 photo and a question: 210)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the same code on a tiny checkpoint")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    model_dir, _ = bench_model(settings.cache_path, args.quick)
    report = {"cpu": cpu_info(settings.num_threads), **run_record(), "tokens": args.tokens, "reps": args.reps,
              "quick": args.quick}
    report["prefill_s"] = measure(model_dir, settings.cache_path, args.tokens, args.reps, settings.num_threads)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill.json").write_text(json.dumps(report, indent=2))
    (args.out / "prefill.md").write_text(markdown(report))
    print((args.out / "prefill.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
