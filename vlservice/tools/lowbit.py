"""`python -m vlservice bench --lowbit`: the LLM's weight kernels at 8 and 4 bits, side by side.

Issue 17's question: would a 4-bit weight path decode faster than the INT8 one we ship? Every
candidate available here runs one decode step's matrix products on the real shapes of
Qwen3-VL-2B-Instruct's language model (per layer: the fused q/k/v product, o, the fused gate/up
product, down; 28 layers; then the LM head), at batch 1 and 4, in one process, one after the other:

- `fbgemm int8, row-scaled` (what `VL_LLM_QUANT=int8` runs): PyTorch's dynamic INT8 linear with
  the per-row activation scaling that keeps a row's answer independent of its batch.
- `ORT MatMulNBits 8-bit` / `4-bit`: ONNX Runtime's weight-only kernels with int8 activations
  quantized per row and block (`accuracy_level` 4), block size 32; one session runs the whole
  step's products as one graph, as a server would.
- `torch int4 weight-only`: `aten._weight_int4pack_mm_for_cpu` (groups of 32; activations in
  bfloat16 on CPUs with AVX-512 BF16, else float32).
- `torch int8 weight-only`: `aten._weight_int8pack_mm` (per-channel scales; float32 activations).
- `torch dynamic 4-bit`: `aten._dyn_quant_matmul_4bit` (KleidiAI on Arm; on x86 a fallback).

Weights are random in each format (a kernel's speed does not depend on the values), so the whole
model never needs to be quantized for this. Reported: milliseconds per step, medians of `--reps`,
and each one's speed relative to the row-scaled INT8 we ship, in the same run. Every output names
the CPU; compare only numbers from one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

BLOCK = 32


def shapes(text: dict) -> tuple[list[tuple[int, int]], int]:
    """((in, out) of one layer's four products, layers) and the LM head's (in, out) appended."""
    h, inter = text["hidden_size"], text["intermediate_size"]
    d = text.get("head_dim") or h // text["num_attention_heads"]
    q, kv = text["num_attention_heads"] * d, text["num_key_value_heads"] * d
    layer = [(h, q + 2 * kv), (q, h), (h, 2 * inter), (inter, h)]
    return [*layer * text["num_hidden_layers"], (h, text["vocab_size"])], text["num_hidden_layers"]


# --------------------------------------------------------------------------- candidates
# Each builds its weights for `products` and returns run(x_by_in_features) -> None.

def fbgemm_int8(products):
    import torch

    from ..engine.model.linears import _RowScaledLinear

    mods = []
    for k, n in products:
        w = torch._make_per_channel_quantized_tensor(torch.randint(-127, 128, (n, k), dtype=torch.int8),
                                                     torch.rand(n, dtype=torch.double) * 1e-2 + 1e-3,
                                                     torch.zeros(n, dtype=torch.long), 0)
        mod = _RowScaledLinear()(k, n, bias_=False, dtype=torch.qint8)
        mod.set_weight_bias(w, None)
        mods.append(mod)

    def run(xs):
        for (k, _), mod in zip(products, mods):
            mod(xs[k])
    return run


def ort_nbits(products, bits: int, threads: int):
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, outputs = [], [], []
    ins = sorted({k for k, _ in products})
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, ["M", k]) for k in ins]
    for i, (k, n) in enumerate(products):
        blocks = -(-k // BLOCK)
        blob = BLOCK * bits // 8
        inits += [numpy_helper.from_array(rng.integers(0, 256, (n, blocks, blob), dtype=np.uint8), f"b{i}"),
                  numpy_helper.from_array((rng.random(n * blocks, dtype=np.float32) * 1e-2 + 1e-3), f"s{i}")]
        nodes.append(helper.make_node("MatMulNBits", [f"x{k}", f"b{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft",
                                      K=k, N=n, bits=bits, block_size=BLOCK, accuracy_level=4))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["M", n]))
    graph = helper.make_graph(nodes, "step", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    del model, graph, inits

    def run(xs):
        sess.run(None, {f"x{k}": xs[k].numpy() for k in ins})
    return run


def torch_int4(products):
    import torch

    dtype = torch.bfloat16 if _has_bf16() else torch.float32
    packed = []
    for k, n in products:
        w = torch.randint(0, 16, (n, k), dtype=torch.int32)
        sz = torch.rand(k // BLOCK, n, 2, dtype=dtype)
        packed.append((torch.ops.aten._convert_weight_to_int4pack_for_cpu(w, 2), sz))

    def run(xs):
        for (k, _), (w, sz) in zip(products, packed):
            torch.ops.aten._weight_int4pack_mm_for_cpu(xs[k].to(dtype), w, BLOCK, sz)
    return run


def torch_int8_weight_only(products):
    import torch

    weights = [(torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n)) for k, n in products]

    def run(xs):
        for (k, _), (w, s) in zip(products, weights):
            torch.ops.aten._weight_int8pack_mm(xs[k], w, s)
    return run


def torch_dyn_4bit(products):
    import torch

    packed = []
    for k, n in products:
        w = torch.randint(0, 16, (n, k // 2), dtype=torch.uint8)
        sz = torch.rand(n, k // BLOCK, dtype=torch.bfloat16)
        packed.append(torch.ops.aten._dyn_quant_pack_4bit_weight(w, sz, None, BLOCK, k, n))

    def run(xs):
        for (k, n), w in zip(products, packed):
            torch.ops.aten._dyn_quant_matmul_4bit(xs[k], w, BLOCK, k, n)
    return run


def _has_bf16() -> bool:
    from ..obs.cpu import cpu_model_and_flags

    return "avx512_bf16" in cpu_model_and_flags()[1]


CANDIDATES = {
    "fbgemm int8, row-scaled (shipped)": lambda p, t: fbgemm_int8(p),
    "ORT MatMulNBits 8-bit": lambda p, t: ort_nbits(p, 8, t),
    "ORT MatMulNBits 4-bit": lambda p, t: ort_nbits(p, 4, t),
    "torch int4 weight-only": lambda p, t: torch_int4(p),
    "torch int8 weight-only": lambda p, t: torch_int8_weight_only(p),
    "torch dynamic 4-bit": lambda p, t: torch_dyn_4bit(p),
}


def measure(text: dict, batches: list, reps: int, threads: int, only=None) -> dict:
    import torch

    from .decodeprof import _median_ms

    torch.set_num_threads(threads)
    products, layers = shapes(text)
    out = {}
    for name, build in CANDIDATES.items():
        if only and name not in only:
            continue
        row: dict = {}
        try:
            run = build(products, threads)
            with torch.inference_mode():
                for b in batches:
                    xs = {k: torch.randn(b, k) for k in {k for k, _ in products}}
                    row[str(b)] = round(_median_ms(lambda run=run, xs=xs: run(xs), reps), 3)
        except Exception as exc:  # a kernel this build or CPU does not have: reported, not fatal
            row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        log.info("%s: %s", name, row)
        out[name] = row
        run = None
        gc.collect()
    return {"products": len(products), "layers": layers, "steps": out}


def markdown(report: dict) -> str:
    from .harness import md_table

    cpu = report["cpu"]
    batches = report["batches"]
    base = report["steps"][next(iter(report["steps"]))]
    lines = [f"*{cpu['model']} ({', '.join(cpu['flags']) or 'no AVX-512'}), {cpu['threads']} threads; one decode "
             f"step's {report['products']} products ({report['layers']} layers' fused q/k/v, o, fused gate/up, down, "
             f"and the LM head) on {'a tiny model' if report.get('quick') else 'the real model'}'s shapes, random weights; "
             f"medians of {report['reps']}.*", ""]
    rows = []
    for name, row in report["steps"].items():
        if "error" in row:
            rows.append([name, f"not available here: {row['error']}"])
            continue
        cells = []
        for b in batches:
            ms, ref = row[str(b)], base.get(str(b))
            cells += [f"{ms:.1f}", f"{ref / ms:.2f}x" if ref and ms else ""]
        rows.append([name, *cells])
    lines += md_table(["weights", *(h for b in batches for h in (f"batch {b} ms", "vs shipped"))], rows)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from ..config import Settings
    from .harness import machine_limits
    from ..build.checkpoints import TINY, real_architecture
    from ..obs.records import cpu_info

    ap = argparse.ArgumentParser(prog="python -m vlservice bench --lowbit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="the same code on a tiny model's shapes")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    threads = Settings.from_env().num_threads
    text = dict(real_architecture()["text_config"])
    if args.quick:
        text.update(TINY["text"], hidden_size=128, intermediate_size=256, vocab_size=1024)
    batches = [int(b) for b in args.batches.split(",")]
    report = {"cpu": cpu_info(threads), "limits": machine_limits(threads, args.quick), "batches": batches,
              "reps": args.reps, "quick": args.quick}
    report.update(measure(text, batches, args.reps, threads))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lowbit.json").write_text(json.dumps(report, indent=2))
    (args.out / "lowbit.md").write_text(markdown(report))
    print((args.out / "lowbit.md").read_text())
    return 0 if "error" not in next(iter(report["steps"].values())) else 1


if __name__ == "__main__":
    raise SystemExit(main())
