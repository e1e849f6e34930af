"""`python -m vlservice bench --decode`: where one decode step's time goes, beside its kernel floor.

For each LLM (float32 with prepacked weights, the opt-in INT8) the real-size checkpoint is loaded
as the server loads it, and, at each batch size the scheduler runs, in one process, one after the
other on the same machine:

- **kernels**: the step's matrix products alone (the 28 layers' q/k/v/o/gate/up/down and the LM
  head), called as the raw kernels on inputs of the step's shape: oneDNN's prepacked linear, or
  fbgemm's dynamic INT8 linear. Nothing can decode faster than this: the kernel floor.
- **attention**: the 28 layers' attention over each sequence's cache (SDPA, as the model runs it).
- **lean step**: the model's decode pass the scheduler calls (`LeanLM.decode`) on caches of the
  same length: kernels + attention + everything around them (norms, rotary, cache writes,
  per-row INT8 scaling, embedding, Python).
- **service**: the scheduler's own cycle per step while B requests decode together through
  `VLModelService.submit` (sampling, detokenising, events and the loop included): what a token
  costs each running stream.

Reported: milliseconds per step, and the share of the kernel floor the service reaches (floor /
service cycle). Every output names the CPU; compare only numbers from one run.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

log = logging.getLogger(__name__)

CONTEXT = 300  # cache length per sequence: a photo's prompt (210 tokens) and part of its answer


def _median_ms(fn, reps: int, warm: int = 2) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _linears(lean) -> list:
    """Every product of a step once: a fused q/k/v (or gate/up) product counts once, not per slice."""
    mods: dict = {}
    for layer in lean.layers:
        a, m = layer.self_attn, layer.mlp
        for mod in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
            mod = getattr(mod, "fused", mod)
            mods[id(mod)] = mod
    return [*mods.values(), lean.lm_head]


def _kernel(mod):
    """The raw product a linear module runs, without its Python wrapper."""
    import torch

    if hasattr(mod, "packed"):  # prepacked float32 (linears.PackedLinear)
        packed, bias = mod.packed, mod.bias
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if hasattr(mod, "_packed_params"):  # dynamic INT8
        params = mod._packed_params._packed_params
        return lambda x: torch.ops.quantized.linear_dynamic(x, params, reduce_range=True)
    return lambda x: torch.nn.functional.linear(x, mod.weight, mod.bias)


def _filled_kvs(lean, batch: int, length: int) -> list:

    kvs = []
    for _ in range(batch):
        kv = lean.new_kv(length + 8)
        for t in kv.keys + kv.values:
            t.normal_()
        kv.length = length
        kvs.append(kv)
    return kvs


def parts(lean, batch: int, reps: int) -> dict:
    """Kernels, attention and the lean step at `batch`, each median of `reps`, in milliseconds."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from ..engine.model.lm import SeqPos

    hidden = lean.embed.weight.shape[1]
    kernels = [(_kernel(m), torch.randn(batch, 1, m.in_features if hasattr(m, "in_features") else hidden))
               for m in _linears(lean)]

    def run_kernels():
        for k, x in kernels:
            k(x)

    attn = lean.layers[0].self_attn
    q = torch.randn(1, lean.num_heads, 1, lean.head_dim)
    kvs = _filled_kvs(lean, batch, CONTEXT)

    def run_attention():
        for _ in lean.layers:
            for kv in kvs:
                sdpa_attention_forward(attn, q, kv.keys[0][:, :CONTEXT].unsqueeze(0),
                                       kv.values[0][:, :CONTEXT].unsqueeze(0), None, dropout=0.0, scaling=attn.scaling)

    pos = [SeqPos(next_pos=CONTEXT) for _ in range(batch)]
    tokens = [100 + i for i in range(batch)]

    def run_step():
        lean.decode(tokens, kvs, pos)
        for kv, p in zip(kvs, pos):
            kv.length = CONTEXT
            p.next_pos = CONTEXT

    with torch.inference_mode():
        out = {"kernels_ms": _median_ms(run_kernels, reps), "attention_ms": _median_ms(run_attention, reps),
               "lean_step_ms": _median_ms(run_step, reps)}
    out["other_ms"] = out["lean_step_ms"] - out["kernels_ms"] - out["attention_ms"]
    return {k: round(v, 2) for k, v in out.items()}


def ort_parts(lm, path: Path, threads: int, batch: int, reps: int) -> dict:
    """int4 (`ortdecode.OrtLM`): the decode call timed as `parts` times the lean step; the
    products (MatMulNBits) and attention (GroupQueryAttention) as their shares of the node time in
    ONNX Runtime's own profile of the same graph on the same caches (a second session, profiling
    on; per-run means), applied to that step."""
    from ..engine.model.lm import SeqPos
    from ..engine.model.ortdecode import OrtLM

    kvs = _filled_kvs(lm, batch, CONTEXT)
    pos = [SeqPos(next_pos=CONTEXT) for _ in range(batch)]
    tokens = [100 + i for i in range(batch)]

    def stepper(decoder):
        def run():
            decoder.decode(tokens, kvs, pos)
            for kv, p in zip(kvs, pos):
                kv.length = CONTEXT
                p.next_pos = CONTEXT
        return run

    step_ms = _median_ms(stepper(lm), reps)
    lm.release_all()
    profiled = OrtLM(path, lm.embed, lm.text_config, threads, profile=True)
    _median_ms(stepper(profiled), reps)
    profiled.release_all()
    ops = _profile_ops(profiled.session.end_profiling(), skip=2)
    # Profiling slows every node down, so the profile gives shares, not times: the products' and
    # attention's shares of all node time, applied to the unprofiled step.
    total = sum(ops.values()) or 1.0
    kernels = step_ms * ops.get("MatMulNBits", 0.0) / total
    attention = step_ms * ops.get("GroupQueryAttention", 0.0) / total
    out = {"kernels_ms": kernels, "attention_ms": attention, "lean_step_ms": step_ms,
           "other_ms": step_ms - kernels - attention, "profiled_ops_ms": total,
           "profiled_matmulnbits_ms": ops.get("MatMulNBits", 0.0)}
    return {k: round(v, 2) for k, v in out.items()}


def _profile_ops(trace: str, skip: int) -> dict:
    """Mean milliseconds per run by operator type in an ONNX Runtime profile, the first `skip`
    runs (warm-up) left out."""
    events = json.loads(Path(trace).read_text())
    Path(trace).unlink()
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")[skip:]
    totals: dict = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and any(a <= e["ts"] <= b for a, b in runs):
            op = e["args"]["op_name"]
            totals[op] = totals.get(op, 0.0) + e["dur"] / 1e3
    return {op: t / max(len(runs), 1) for op, t in totals.items()}


def service_cycle(svc, batch: int, tokens: int) -> dict:
    """B text requests decoding together through the service: the scheduler's cycle at B."""
    from ..engine.types import ChatRequest, Message, Sampling

    words = " ".join(["picture"] * (CONTEXT - 40))
    before = {b: list(v) for b, v in svc.scheduler.step_times.items()}
    gens = [svc.submit(ChatRequest(messages=[Message("user", [f"{i}: {words}. Describe it."])],
                                   sampling=Sampling(max_tokens=tokens, min_tokens=tokens, temperature=0.0),
                                   result_cache=False))
            for i in range(batch)]
    for g in gens:
        for ev in g.events():
            if ev is not None and ev.kind in ("done", "error"):
                if ev.kind == "error":
                    raise RuntimeError(ev.error)
                break
    now = svc.scheduler.step_times.get(batch, [0, 0.0, 0.0, 0, 0.0])
    old = before.get(batch, [0, 0.0, 0.0, 0, 0.0])
    steps, fwd, step, cycles, cycle_s = (a - b for a, b in zip(now, old))
    if not cycles:
        return {"cycles": 0}
    return {"cycles": cycles, "forward_ms": round(fwd / steps * 1e3, 2), "step_ms": round(step / steps * 1e3, 2),
            "cycle_ms": round(cycle_s / cycles * 1e3, 2)}


def greedy(lean, prompt: list, n: int) -> tuple[list, "object"]:
    """`n` greedy token ids after a text prompt through the lean pass, and the prompt's logits."""
    import torch

    from ..engine.model.lm import SeqPos

    with torch.inference_mode():
        kv = lean.new_kv(len(prompt) + n)
        embeds = lean.embed(torch.tensor([prompt], dtype=torch.long))
        positions = torch.arange(len(prompt)).view(1, 1, -1).expand(3, 1, -1)
        logits = lean.prefill(kv, embeds, positions)
        first = logits.clone()
        pos, out = SeqPos(next_pos=len(prompt)), []
        for _ in range(n):
            out.append(int(logits.argmax()))
            logits = lean.decode([out[-1]], [kv], [pos])[0]
    return out, first


PARITY_PROMPT = [(i * 7919) % 50000 + 100 for i in range(64)]


def reference(model_dir: Path, llm: str, cache_dir: Path, n: int) -> tuple[list, "object"]:
    """The answer before this decode path's changes: float32 with plain `nn.Linear` weights, or the
    INT8 LLM with its seven separate products per layer; loaded, run and freed before the service."""
    import gc

    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from ..engine.model.lm import LeanLM
    from ..engine.model.quant import load_int8_model
    from ..engine.model.linears import make_rows_independent

    if llm in ("float32", "int4"):  # int4 is compared with float32 itself
        model = Qwen3VLForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    else:
        model, _ = load_int8_model(model_dir, cache_dir, need_vision=False)
        make_rows_independent(model)
    result = greedy(LeanLM(model), PARITY_PROMPT, n)
    del model
    gc.collect()
    return result


def parity(ref: tuple, got: tuple) -> dict:
    (ref_ids, ref_logits), (ids, logits) = ref, got
    same = next((i for i, (a, b) in enumerate(zip(ref_ids, ids)) if a != b), len(ids))
    diff = (logits - ref_logits).abs()
    return {"tokens": len(ids), "identical_tokens": same, "logits_max_abs_diff": float(diff.max()),
            "logits_max_rel_diff": float(diff.max() / ref_logits.abs().max()),
            "logits_std": float(ref_logits.std()), "bitwise_equal": bool((diff == 0).all())}


def measure_llm(model_dir: Path, llm: str, batches: list, reps: int, tokens: int, cache_dir: Path,
                parity_tokens: int = 0) -> dict:
    import torch

    from ..config import Settings
    from ..engine.service import VLModelService

    settings = Settings.from_env(model=str(model_dir), llm_quant="" if llm == "float32" else llm,
                                 max_batch=max(batches), result_cache_entries=0, kv_cache_mb=0,
                                 disk_cache_mb=0, cache_dir=str(cache_dir))
    ref = None
    if parity_tokens:
        torch.set_num_threads(settings.num_threads)
        ref = reference(model_dir, llm, cache_dir, parity_tokens)
    svc = VLModelService(settings).start()
    try:
        out: dict = {"batches": {}, "parity": None}
        if ref is not None:
            out["parity"] = parity(ref, greedy(svc.lean, PARITY_PROMPT, parity_tokens))
            log.info("%s parity with the reference: %s", llm, out["parity"])
        for b in batches:
            if llm == "int4":
                from ..engine.model.ortdecode import ensure_decoder

                path, _ = ensure_decoder(model_dir, cache_dir)
                row = ort_parts(svc.lean, path, settings.num_threads, b, reps)
            else:
                row = parts(svc.lean, b, reps)
            row["service"] = service_cycle(svc, b, tokens)
            cycle = row["service"].get("cycle_ms")
            row["floor_share"] = round(row["kernels_ms"] / cycle, 3) if cycle else None
            out["batches"][str(b)] = row
            log.info("%s batch %d: %s", llm, b, row)
        return out
    finally:
        svc.close()


def markdown(report: dict) -> str:
    from .harness import md_table

    cpu = report["cpu"]
    lines = [f"*{cpu['model']} ({', '.join(cpu['flags']) or 'no AVX-512'}), {cpu['threads']} threads, "
             f"{report['limits']['bandwidth_gb_s']} GB/s measured in this run; caches of {CONTEXT} positions; "
             f"medians of {report['reps']} steps (service: the mean scheduler cycle over {report['tokens']}-token "
             "answers).*", ""]
    rows = []
    for llm, result in report["llms"].items():
        for b, r in result["batches"].items():
            s = r["service"]
            cycle = s.get("cycle_ms")
            rows.append([llm, b, r["kernels_ms"], r["attention_ms"], r["other_ms"], r["lean_step_ms"],
                         s.get("forward_ms", ""), cycle or "", "%.0f%%" % (100 * r["floor_share"]) if cycle else "",
                         "%.1f" % (1e3 / cycle) if cycle else "", "%.1f" % (int(b) * 1e3 / cycle) if cycle else ""])
    lines += md_table(["LLM", "batch", "kernels (floor) ms", "attention ms", "other ms", "lean step ms",
                       "service forward ms", "service cycle ms", "floor / service", "tok/s per stream",
                       "tok/s all streams"], rows)
    refs = {"float32": "plain nn.Linear weights", "int8": "seven separate INT8 products per layer",
            "int4": "float32 (plain nn.Linear weights)"}
    checks = [(llm, r["parity"]) for llm, r in report["llms"].items() if r["parity"]]
    if checks:
        lines += ["", "Answers against the reference (a 64-token text prompt, greedy):", "", *md_table(
            ["LLM", "reference", "greedy tokens identical", "logits max abs diff", "relative to max logit",
             "logits std", "bitwise equal"],
            [[llm, refs.get(llm, ""), f"{c['identical_tokens']} of {c['tokens']}", f"{c['logits_max_abs_diff']:.3g}",
              f"{c['logits_max_rel_diff']:.3g}", f"{c['logits_std']:.3g}", c["bitwise_equal"]] for llm, c in checks])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from .harness import start_report

    ap = argparse.ArgumentParser(prog="python -m vlservice bench --decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--llm", default="float32,int8,int4", help="comma-separated: float32, int8, int4")
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--parity-tokens", type=int, default=64,
                    help="greedy tokens compared with the reference (plain float32 / unfused INT8); 0 = skip")
    ap.add_argument("--quick", action="store_true", help="the same code on a tiny checkpoint")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    settings, model_dir, report = start_report(args)
    report.update({"reps": args.reps, "tokens": args.tokens, "llms": {}})
    batches = [int(x) for x in args.batches.split(",")]
    for llm in args.llm.split(","):
        report["llms"][llm] = measure_llm(model_dir, llm, batches, args.reps, args.tokens, settings.cache_path,
                                          args.parity_tokens)
    (args.out / "decode.json").write_text(json.dumps(report, indent=2))
    (args.out / "decode.md").write_text(markdown(report))
    print((args.out / "decode.md").read_text())
    return 0 if all(r["service"].get("cycles") for res in report["llms"].values() for r in res["batches"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
