"""Train the bundled demo model: a tiny Qwen3-VL that really answers about generated images.

`python -m vlservice train-demo [--out DIR] [--steps N] [--seed S]` builds the real
`Qwen3VLForConditionalGeneration` at a tiny size with a small closed Qwen vocabulary, trains it on
`vlservice.demo.data` samples preprocessed by the serving path itself (`vlservice.images`, so
training and serving see identical pixels), and saves a normal checkpoint (safetensors,
tokenizer, chat template, preprocessor config) that the server loads like the real model.
A loss curve is written as a PNG beside it. Same seed, same data, same initial weights.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from pathlib import Path

import numpy as np

from .data import PROMPTS, iter_samples, make_sample

log = logging.getLogger("vlservice.demo")

DEMO_SIZES = {
    "text": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                 rope_scaling={"mrope_interleaved": True, "mrope_section": [6, 5, 5], "rope_type": "default"}),
    "vision": dict(depth=4, hidden_size=128, intermediate_size=384, num_heads=4, out_hidden_size=128,
                   deepstack_visual_indexes=[1, 2, 3], num_position_embeddings=256),
}
# Small images: the demo's pictures are small, and a CPU demo should answer in well under a second.
DEMO_PREPROCESSOR = {"size": {"shortest_edge": 128 * 128, "longest_edge": 320 * 320}}
VOCAB_LIMIT = 1024


def corpus_texts(seed: int = 12345, n: int = 4000) -> list[str]:
    """Every prompt and answer form, so the small vocabulary spells them in few tokens."""
    texts = {p for lang in PROMPTS.values() for p in lang.values()}
    texts |= {t for s in iter_samples(seed, n) for t in (s.question, s.answer)}
    return sorted(texts)


class Batcher:
    """Samples to padded model inputs, through the same preprocessing as serving."""

    def __init__(self, tokenizer, spec, image_token_id: int):
        self.tok, self.spec, self.image_token_id = tokenizer, spec, image_token_id
        self.pad = tokenizer.pad_token_id

    def encode(self, sample):
        from .. import images as I
        from ..generate import build_prompt

        p = I.prepare(sample.image, self.spec)
        chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": sample.question}]}]
        prompt = build_prompt(self.tok, chat, [p.num_tokens], [p.grid_thw])
        answer = self.tok(sample.answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        return prompt.input_ids, answer, p

    def __call__(self, samples):
        import torch

        rows = [self.encode(s) for s in samples]
        length = max(len(a) + len(b) for a, b, _ in rows)
        ids = torch.full((len(rows), length), self.pad, dtype=torch.long)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, (prompt, answer, _) in enumerate(rows):
            seq = prompt + answer
            ids[i, :len(seq)] = torch.tensor(seq)
            labels[i, len(prompt):len(seq)] = torch.tensor(answer)
            mask[i, :len(seq)] = 1
        return {
            "input_ids": ids, "attention_mask": mask, "labels": labels,
            "mm_token_type_ids": (ids == self.image_token_id).int(),
            "pixel_values": torch.from_numpy(np.concatenate([p.pixel_values for _, _, p in rows])),
            "image_grid_thw": torch.tensor([list(p.grid_thw) for _, _, p in rows]),
        }


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def plot_loss(losses: list[float], path: Path) -> None:
    """A loss curve as a PNG, drawn with OpenCV (no plotting library needed)."""
    import cv2

    w, h, m = 800, 400, 50
    img = np.full((h, w, 3), 255, np.uint8)
    k = max(1, len(losses) // 200)
    smooth = [float(np.mean(losses[i:i + k])) for i in range(0, len(losses), k)]
    top, bottom = max(smooth), min(smooth)
    span = max(top - bottom, 1e-6)
    pts = np.array([[m + i * (w - 2 * m) / max(1, len(smooth) - 1), h - m - (v - bottom) / span * (h - 2 * m)]
                    for i, v in enumerate(smooth)], np.int32)
    cv2.rectangle(img, (m, m), (w - m, h - m), (200, 200, 200), 1)
    cv2.polylines(img, [pts], False, (200, 80, 30), 2, cv2.LINE_AA)
    cv2.putText(img, f"training loss: {top:.2f} -> {smooth[-1]:.3f} over {len(losses)} steps", (m, 30),
                cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.putText(img, f"{bottom:.3f}", (5, h - m), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.putText(img, f"{top:.2f}", (5, m + 10), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.imwrite(str(path), img)


def train(out: Path, steps: int, seed: int, batch_size: int, lr: float, threads: int, init: Path | None = None,
          warmup: int = 100) -> dict:
    import torch
    from tqdm import tqdm
    from transformers import Qwen3VLForConditionalGeneration

    from .. import images as I
    from ..models import make_config, make_model, preprocessor_config, real_architecture, token_ids
    from ..tokenizer import build_tokenizer

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    texts = corpus_texts()
    tok = build_tokenizer(VOCAB_LIMIT, keep_texts=texts)
    tok.pad_token = "<|endoftext|>"
    ids = token_ids(tok)
    config = make_config(DEMO_SIZES, vocab_size=(len(tok) + 63) // 64 * 64, token_ids=ids)
    if init is not None:  # continue from a checkpoint made by this script (same vocabulary)
        model = Qwen3VLForConditionalGeneration.from_pretrained(str(init), dtype=torch.float32)
    else:
        model = Qwen3VLForConditionalGeneration(config)
    model.train()
    pre = preprocessor_config(real_architecture())
    pre.update(DEMO_PREPROCESSOR)
    spec = I.ImageSpec.from_preprocessor_config(pre)
    batcher = Batcher(tok, spec, ids["image_token_id"])
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98))
    rng = np.random.default_rng(seed)
    losses, t0 = [], time.time()
    bar = tqdm(range(steps), desc="train-demo", unit="step")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        batch = batcher([make_sample(rng) for _ in range(batch_size)])
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss))
        if step % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    make_model(out, DEMO_SIZES, vocab_limit=VOCAB_LIMIT, keep_texts=texts, model=model,
               preprocessor=DEMO_PREPROCESSOR)
    previous = json.loads((init / "training.json").read_text()) if init and (init / "training.json").is_file() else None
    info = {"steps": steps, "seed": seed, "batch_size": batch_size, "lr": lr, "minutes": (time.time() - t0) / 60,
            "continued_from": previous,
            "final_loss": float(np.mean(losses[-100:])), "params": sum(p.numel() for p in model.parameters())}
    (out / "training.json").write_text(json.dumps(info, indent=2))
    plot_loss(losses, out / "loss.png")
    return info


def main(argv=None) -> int:
    from ..models import bundled_demo_path

    ap = argparse.ArgumentParser(prog="python -m vlservice train-demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=bundled_demo_path())
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--init", type=Path, default=None, help="continue training this checkpoint")
    ap.add_argument("--warmup", type=int, default=100)
    args = ap.parse_args(argv)
    from ..config import _physical_cores

    info = train(args.out, args.steps, args.seed, args.batch_size, args.lr, args.threads or _physical_cores(),
                 args.init, args.warmup)
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
