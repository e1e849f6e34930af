"""`python -m vlservice bench --constraints`: what structured output and forced tool calls cost.

On the real-size checkpoint (the real Qwen vocabulary, 151,936 rows of logits), in one process:

- **compile**: the tokenizer in llguidance's form (once per service), then each grammar cold
  (a receipt schema, a shape-list schema, two tools forced with "required") and from the cache
  (a copy of the compiled matcher, what every later request with that schema pays).
- **mask**: `Constraint.apply` on one row of the real vocabulary along a valid answer: the
  matcher's mask, unpacked and laid on the row, per token (median).
- **in the step**: B requests decode together through `VLModelService.submit` with a schema and
  again without one; the scheduler's cycle per step at B, and each request's own
  `grammar_mask_ms` per token, summed over the B rows: the share of a step the masks take.

Every output names the CPU; compare only numbers from one run.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

log = logging.getLogger(__name__)

RECEIPT = {"type": "object", "properties": {
    "merchant": {"type": "string", "maxLength": 40}, "date": {"type": "string", "maxLength": 10},
    "items": {"type": "array", "maxItems": 20, "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "price": {"type": "number", "minimum": 0}},
        "required": ["name", "price"]}},
    "total": {"type": "number", "minimum": 0}}, "required": ["merchant", "items", "total"]}
SHAPES = {"type": "object", "properties": {"shapes": {"type": "array", "items": {"type": "object", "properties": {
    "shape": {"enum": ["circle", "square", "triangle", "star"]},
    "color": {"enum": ["red", "green", "blue", "yellow"]}}, "required": ["shape", "color"]}},
    "count": {"type": "integer", "minimum": 0}}, "required": ["shapes", "count"]}
# Long enough that a random-weight model's constrained answer runs the whole `--tokens`.
NOTES = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
         "required": ["notes"]}
RECEIPT_ANSWER = {"merchant": "Corner Shop", "date": "2026-12-07", "items": [
    {"name": "Bread", "price": 2.5}, {"name": "Milk", "price": 1.2}, {"name": "Apples", "price": 3.15}], "total": 6.85}


def _ms(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e3, 3)


def compile_costs(tokenizer, eos_ids, rows: int) -> dict:
    """Cold and cached compile times, and the mask per token on one row of the real vocabulary."""
    import torch

    from ..engine.output.constrain import Grammars, grammar_for, tool_grammar

    t = time.perf_counter()
    grammars = Grammars(tokenizer, eos_ids)  # the tokenizer in llguidance's form, as the service builds it
    out: dict = {"vocab": grammars.llt.vocab_size, "tokenizer_ms": round((time.perf_counter() - t) * 1e3, 1),
                 "grammars": {}}
    tools = [("record_shapes", SHAPES["properties"]["shapes"]["items"]), ("read_receipt", RECEIPT)]
    cases = {"receipt": lambda: grammar_for("json_schema", RECEIPT),
             "shape list": lambda: grammar_for("json_schema", SHAPES),
             "two tools, required": lambda: tool_grammar(tools)}
    for name, make in cases.items():
        t = time.perf_counter()
        grammar = make()
        text_ms = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        grammars.matcher(grammar)
        cold_ms = (time.perf_counter() - t) * 1e3
        out["grammars"][name] = {"schema_to_grammar_ms": round(text_ms, 2), "compile_ms": round(cold_ms, 2),
                                 "cached_ms": _ms(lambda g=grammar: grammars.matcher(g), 20)}
    # the mask along a valid receipt, token by token, on a row of the model's logits
    constraint = grammars.constraint(grammar_for("json_schema", RECEIPT))
    ids = tokenizer.encode(json.dumps(RECEIPT_ANSWER), add_special_tokens=False)
    row = torch.randn(rows)
    times = []
    for token in ids:
        t = time.perf_counter()
        masked = constraint.apply(row)
        times.append(time.perf_counter() - t)
        assert masked[token] > -float("inf"), "the grammar refused a valid answer"
        constraint.advance(token)
    out["mask"] = {"tokens": len(ids), "row": int(row.shape[0]), "median_ms": round(statistics.median(times) * 1e3, 3),
                   "p90_ms": round(sorted(times)[int(0.9 * (len(times) - 1))] * 1e3, 3)}
    return out


def step_costs(svc, batch: int, tokens: int, grammar: str | None) -> dict:
    """B requests decoding together: the scheduler's cycle per step, and the masks' time per token
    (per request, summed over the batch)."""
    from ..engine.types import ChatRequest, Message, Sampling

    before = {b: list(v) for b, v in svc.scheduler.step_times.items()}
    gens = [svc.submit(ChatRequest(messages=[Message("user", [f"{i}: list notes about a photo of a street."])],
                                   sampling=Sampling(max_tokens=tokens, min_tokens=0 if grammar else tokens,
                                                     temperature=0.0, grammar=grammar), result_cache=False))
            for i in range(batch)]
    results = [g.result() for g in gens]
    now = svc.scheduler.step_times.get(batch, [0, 0.0, 0.0, 0, 0.0])
    old = before.get(batch, [0, 0.0, 0.0, 0, 0.0])
    steps, _fwd, _step, cycles, cycle_s = (a - b for a, b in zip(now, old))
    per_token = [r["timings"].get("grammar_mask_ms", 0.0) / max(1, r["usage"]["completion_tokens"]) for r in results]
    return {"cycles": cycles, "cycle_ms": round(cycle_s / cycles * 1e3, 2) if cycles else None,
            "tokens": [r["usage"]["completion_tokens"] for r in results],
            "mask_ms_per_step": round(sum(per_token), 3)}


def measure(model_dir: Path, cache_dir: Path, batches: list, tokens: int, llm: str) -> dict:
    from ..config import Settings
    from ..engine.output.constrain import grammar_for
    from ..engine.service import VLModelService

    settings = Settings.from_env(model=str(model_dir), llm_quant="" if llm == "float32" else llm,
                                 max_batch=max(batches), result_cache_entries=0, kv_cache_mb=0, disk_cache_mb=0,
                                 cache_dir=str(cache_dir))
    svc = VLModelService(settings).start()
    try:
        rows = json.loads((model_dir / "config.json").read_text())["text_config"]["vocab_size"]
        report = {"compile": compile_costs(svc.tokenizer, svc.inputs.eos_ids, rows), "batches": {}}
        log.info("compile and mask: %s", report["compile"])
        grammar = grammar_for("json_schema", NOTES)
        step_costs(svc, 1, 4, grammar)  # warm: the grammar compiled, the scheduler's first steps
        for b in batches:
            plain = step_costs(svc, b, tokens, None)
            constrained = step_costs(svc, b, tokens, grammar)
            share = (constrained["mask_ms_per_step"] / plain["cycle_ms"]) if plain["cycle_ms"] else None
            report["batches"][str(b)] = {"plain": plain, "constrained": constrained,
                                         "mask_share_of_step": round(share, 4) if share is not None else None}
            log.info("batch %d: %s", b, report["batches"][str(b)])
        return report
    finally:
        svc.close()


def markdown(report: dict) -> str:
    from .harness import md_table

    c = report["results"]["compile"]
    lines = [f"# What constraints cost ({report['llm']} LLM)", "",
             f"CPU: {report['cpu'].get('model', '?')} ({', '.join(report['cpu'].get('flags', []))}); {report['date']}; "
             f"`{report['command']}`", "",
             f"Vocabulary {c['vocab']:,}; the tokenizer in llguidance's form: {c['tokenizer_ms']} ms (once, as the "
             "service starts).", "",
             *md_table(["grammar", "schema to grammar ms", "cold compile ms", "cached ms"],
                       [[name, g["schema_to_grammar_ms"], g["compile_ms"], g["cached_ms"]]
                        for name, g in c["grammars"].items()])]
    m = c["mask"]
    lines += ["", f"Mask on one row of {m['row']:,} logits along a {m['tokens']}-token receipt: median "
                  f"{m['median_ms']} ms, p90 {m['p90_ms']} ms per token.", ""]
    rows = [[b, r["plain"]["cycle_ms"], r["constrained"]["cycle_ms"], r["constrained"]["mask_ms_per_step"],
             "" if r["mask_share_of_step"] is None else f"{r['mask_share_of_step']:.2%}"]
            for b, r in report["results"]["batches"].items()]
    lines += md_table(["batch", "step ms, no constraint", "step ms, all constrained", "masks ms per step",
                       "share of the step"], rows)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from .harness import start_report

    ap = argparse.ArgumentParser(prog="python -m vlservice bench --constraints", description=__doc__.split("\n\n")[0])
    ap.add_argument("--llm", default="float32", help="float32, int8 or int4")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="the same code on a tiny checkpoint")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    settings, model_dir, report = start_report(args)
    report.update({"llm": args.llm, "tokens": args.tokens})
    report["results"] = measure(model_dir, settings.cache_path, [int(b) for b in args.batches.split(",")],
                                args.tokens, args.llm)
    (args.out / "constraints.json").write_text(json.dumps(report, indent=2))
    (args.out / "constraints.md").write_text(markdown(report))
    print((args.out / "constraints.md").read_text())
    return 0 if all(r["plain"]["cycles"] and r["constrained"]["cycles"]
                    for r in report["results"]["batches"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
