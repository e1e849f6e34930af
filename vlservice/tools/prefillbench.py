"""`python -m vlservice bench --prefill`: a photo's prompt through each LLM's prefill, side by side.

Where a new photo's first token goes, after the vision encoder: the prompt's prefill. This times
one image-shaped prompt (`--tokens` positions, the middle ones image tokens with deepstack
features, as a 448x448 photo gives) through the int4 runner (the whole language model as one ONNX
Runtime graph over 4-bit weights, `engine/model/ortdecode.py`) and through PyTorch's INT8 `LeanLM`
(fbgemm, `VL_LLM_QUANT=int8`: what the int4 setting used for prompts before it became one model),
one after the other in one process, on the same inputs. Medians of `--reps` after one warm-up.
Inputs are random (a kernel's speed does not depend on the values); every output names the CPU.

Then the kernels alone (`kernels`): one product of the model's widest shape (hidden x intermediate),
at one row (a decode step) and at the prompt's rows, in ONNX Runtime's `MatMulNBits` (4-bit weights)
at several block sizes and accuracy levels (4: int8 activations, 0: float32), beside PyTorch's
dynamic INT8 `Linear` (fbgemm): what bounds the 4-bit prefill, and which knobs do not move it.
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

    from ..engine.model.lm import LeanLM
    from ..engine.model.ortdecode import OrtLM, ensure_decoder
    from ..engine.model.quant import load_embedding_model, load_int8_model
    from ..engine.model.linears import fuse_int8_projections, make_rows_independent

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


def _matmulnbits(k: int, n: int, block: int, accuracy: int, threads: int):
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = -(-k // block)
    weights = rng.integers(0, 256, size=(n, blocks, block // 2), dtype=np.uint8)
    scales = rng.random(n * blocks, dtype=np.float32) * 0.01
    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block, accuracy_level=accuracy)
    graph = helper.make_graph([node], "product", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
                              initializer=[numpy_helper.from_array(weights, "B"), numpy_helper.from_array(scales, "S")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _gops(m: int, k: int, n: int, ms: float) -> float:
    return float(f"{2 * m * k * n / ms / 1e6:.3g}")


def kernels(k: int, n: int, rows: list[int], reps: int, threads: int) -> dict:
    """GOPS (2*M*K*N per second) of one (M x K) @ (K x N) product in each kernel."""
    import warnings

    import numpy as np
    import torch

    from .decodeprof import _median_ms

    torch.set_num_threads(threads)
    out: dict[str, dict[str, float]] = {}
    for block, accuracy in ((32, 4), (128, 4), (256, 4), (128, 0)):
        session = _matmulnbits(k, n, block, accuracy, threads)
        name = f"MatMulNBits 4-bit, block {block}, {'int8' if accuracy == 4 else 'float32'} activations"
        out[name] = {}
        for m in rows:
            a = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
            out[name][str(m)] = _gops(m, k, n, _median_ms(lambda s=session, a=a: s.run(None, {"A": a}), reps))
    layer = torch.ao.nn.quantized.dynamic.Linear(k, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        weight = torch.quantize_per_channel(torch.randn(n, k), torch.rand(n) * 0.01 + 1e-3,
                                            torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    layer.set_weight_bias(weight, None)
    name = "PyTorch dynamic INT8 Linear (fbgemm), per-channel int8 weights"
    out[name] = {}
    with torch.inference_mode():
        for m in rows:
            x = torch.randn(m, k)
            out[name][str(m)] = _gops(m, k, n, _median_ms(lambda x=x: layer(x), reps))
    return out


def markdown(report: dict) -> str:
    from .harness import md_table

    cpu = report["cpu"]
    rows = [[name, f"{s:.2f}", f"{report['tokens'] / s:.0f}"] for name, s in report["prefill_s"].items()]
    return "\n".join([f"*{cpu['model']} ({', '.join(cpu['flags']) or 'no AVX-512'}), {cpu['threads']} threads; "
                      f"one prompt of {report['tokens']} positions ({min(IMAGE_TOKENS, report['tokens'] - 2)} "
                      f"of them image tokens with deepstack features) on {'a tiny' if report['quick'] else 'the real'}"
                      f" model's shapes; medians of {report['reps']}.*", "",
                      *md_table(["LLM", "prefill s", "tokens/s"], rows), "",
                      *kernel_table(report)]) + "\n"


def kernel_table(report: dict) -> list[str]:
    from .harness import md_table

    shape = report.get("kernel_shape")
    if not shape:
        return []
    rows_m = list(next(iter(report["kernels"].values())))
    rows = [[name, *(str(gops[m]) for m in rows_m)] for name, gops in report["kernels"].items()]
    return [f"*One product of {shape[0]} x {shape[1]} weights; GOPS (2·M·K·N per second), medians of "
            f"{report['reps']}.*", "", *md_table(["kernel", *(f"M = {m}" for m in rows_m)], rows)]


def main(argv=None) -> int:
    from ..config import Settings
    from ..obs.records import cpu_info, run_record
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
    text = json.loads((model_dir / "config.json").read_text())["text_config"]
    report["kernel_shape"] = [text["hidden_size"], text["intermediate_size"]]
    report["kernels"] = kernels(*report["kernel_shape"], [1, args.tokens], args.reps, settings.num_threads)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill.json").write_text(json.dumps(report, indent=2))
    (args.out / "prefill.md").write_text(markdown(report))
    print((args.out / "prefill.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
