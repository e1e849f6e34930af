"""Train the bundled demo model: a tiny Qwen3-VL that really answers about generated images.

`python -m vlservice train-demo --out DIR [--steps N] [--seed S]` builds the real
`Qwen3VLForConditionalGeneration` at a tiny size with a small closed Qwen vocabulary, trains it on
`vlservice.demo.data` samples preprocessed by the serving path itself (`vlservice.engine.media.images`, so
training and serving see identical pixels), and saves a normal checkpoint (safetensors,
tokenizer, chat template, preprocessor config) that the server loads like the real model.
Two training aids speed it up (README: The bundled demo model): a per-token loss on the vision
encoder's output (a linear probe, not saved, predicts the shape, colour and character under each
token from `data.label_maps`, and where the token lies in the image), and follow-up questions about
the same image packed as later chat turns. `--init` continues a checkpoint (adopting a grown
vocabulary: rows of tokens it knew are kept, new tokens start as the mean of the pieces the old
vocabulary spelled them with), `--focus` draws half the samples from the weak tasks, `--mix varied` draws most pictures from
`vlservice.demo.render`'s many styles with questions in many phrasings (`--mix classic`: the first
recipe's generator and presets only).
A loss curve is written as a PNG beside it. Same seed, same data, same initial weights.

`--out` has no default and the shipped model (`vlservice/assets/demo-model`) is written only with
`--overwrite-bundled`: a trial run must not silently replace the model the server and the README's
numbers are about. The held-out seeds of `evaluate` are refused as training seeds.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..config import Settings
from .clips import Clip, make_clip
from .clips import answer as clip_answer
from .data import BOX_STEP, COLORS, COLORS_ZH, SHAPES, SHAPES_ZH, TASKS, follow_ups, iter_samples, make_sample
from .phrasings import AROUND, TRAIN
from .render import iter_styled_samples, make_styled_sample

log = logging.getLogger(__name__)

DEMO_SIZES = {
    "text": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 32, "tie_word_embeddings": True,
             "rope_scaling": {"mrope_interleaved": True, "mrope_section": [6, 5, 5], "rope_type": "default"}},
    "vision": {"depth": 4, "hidden_size": 128, "intermediate_size": 384, "num_heads": 4, "out_hidden_size": 128,
               "deepstack_visual_indexes": [1, 2, 3], "num_position_embeddings": 256},
}
# Small images: the demo's pictures are small, and a CPU demo should answer in well under a second.
DEMO_PREPROCESSOR = {"size": {"shortest_edge": 128 * 128, "longest_edge": 320 * 320}}
VOCAB_LIMIT = 1024


# A clip's frames as the server samples them for `detail: auto` (its default)
VIDEO_FRAME_PIXELS = Settings.video_detail_auto_pixels

MIXES = ("classic", "varied")
CLASSIC_SHARE = 0.3  # of a varied mix's samples: the classic generator's, so its presets stay sharp


def training_phrasings() -> set[str]:
    """Every training phrasing with every shape (and coloured shape) filled in; never the held-out ones."""
    names = {"en": ([*SHAPES], [f"{c} {s}" for c in COLORS for s in SHAPES]),
             "zh": ([*SHAPES_ZH.values()], [f"{c}的{s}" for c in COLORS_ZH.values() for s in SHAPES_ZH.values()])}
    out = set()
    for lang, kinds in TRAIN.items():
        shapes, objects = names[lang]
        for phrasings in kinds.values():
            for p in phrasings:
                out |= {p.format(shape=x, object=y) for x in shapes for y in shapes + objects}
    return out


def corpus_texts(seed: int = 12345, n: int = 4000) -> list[str]:
    """Every training question and answer form, so the small vocabulary spells them in few tokens."""
    return list(_corpus_texts(seed, n))


@functools.lru_cache(maxsize=2)
def _corpus_texts(seed: int, n: int) -> tuple[str, ...]:
    """`corpus_texts`, drawn once per process: it renders thousands of samples for their texts."""
    texts = training_phrasings() | {w.strip() for lang in AROUND.values() for ws in lang.values() for w in ws}
    texts |= {t for s in iter_samples(seed, n) for t in (s.question, s.answer)}
    texts |= {s.answer for s in iter_styled_samples(seed, n)}
    texts |= {clip_answer(event, shape, (a, b if event == "change" else a), side, lang)
              for event in ("move", "change") for shape in SHAPES for a in COLORS for b in COLORS if a != b
              for side in ("left", "right") for lang in ("en", "zh")}
    texts |= {f"<{t / 10:.1f} seconds>" for t in range(0, 100, 5)}  # a clip's timestamps
    return tuple(sorted(texts))


def adopt_vocabulary(model, old_tok, new_tok) -> None:
    """Give ``model`` (trained with ``old_tok``) the embedding rows of ``new_tok``'s ids: a token
    it knew keeps its row, a new one starts as the mean of the rows that spelled it before. The
    config's special token ids (image, vision start, ...) move with them."""
    import torch

    from ..build.checkpoints import token_ids

    old_vocab, new_vocab = old_tok.get_vocab(), new_tok.get_vocab()
    if old_vocab == new_vocab:
        return
    old = model.get_input_embeddings().weight.detach().clone()
    size = (len(new_tok) + 63) // 64 * 64
    model.resize_token_embeddings(size)
    model.config.text_config.vocab_size = size
    ids = token_ids(new_tok)
    for key, value in ids.items():
        if key != "eos_token_id":
            setattr(model.config, key, value)
    model.config.text_config.eos_token_id = ids["eos_token_id"]
    model.config.text_config.bos_token_id = ids["bos_token_id"]
    weight = model.get_input_embeddings().weight
    with torch.no_grad():
        weight.copy_(old.mean(0))
        for token, i in new_vocab.items():
            if token in old_vocab:
                weight[i] = old[old_vocab[token]]
            else:
                weight[i] = old[_spelled(token, old_vocab)].mean(0)
    model.tie_weights()


def _spelled(token: str, vocab: dict[str, int]) -> list[int]:
    """Ids of ``token`` spelled greedily (longest piece first) in ``vocab``; a byte-level vocabulary
    holds every single byte, so any token can be spelled."""
    ids, i = [], 0
    while i < len(token):
        j = max(j for j in range(i + 1, len(token) + 1) if token[i:j] in vocab)
        ids.append(vocab[token[i:j]])
        i = j
    return ids


POSITION_TARGETS = 2  # per token: its centre's column and row, relative to the image (0-1)
BOX_TARGETS = 5  # per token: the box of the shape under it (x1, y1, x2, y2, relative) and 1, or 0s
# per token on a shape: the classes of the digits a grounding answer writes for its box, each of
# x1, y1, x2, y2 on the 0-1000 scale in steps of data.BOX_STEP: hundreds (0-10) and tens (0-9)
DIGIT_CLASSES = (11, 10)
DIGIT_TARGETS = 4 * len(DIGIT_CLASSES)


def token_targets(sample, size: tuple[int, int], block: int) -> np.ndarray:
    """What lies under each vision output token, and where: per-class pixel shares of the three
    label maps, then the box of the shape the token shows (relative to the image, 0-1, and a 1; all
    0 for a token on no shape), then the token centre's column and row relative to the image (0-1).

    ``size`` is the resized (h, w) the serving path feeds the encoder and ``block`` the pixels a
    merged token covers (patch_size * merge_size); rows follow the encoder's token order. The box
    and position columns ask the encoder to say where each token and its shape lie in a form the
    language model can read out: grounding answers are boxes relative to the image, and any token
    of a shape then carries its whole box.
    """
    import cv2

    from .data import LABEL_CLASSES, label_maps

    h, w = size
    maps = cv2.resize(label_maps(sample), (w, h), interpolation=cv2.INTER_NEAREST)
    rows, cols = np.arange(h) // block, np.arange(w) // block
    token = (rows[:, None] * (w // block) + cols[None, :]).ravel()  # raster order of merged tokens
    gh, gw = h // block, w // block
    n = gh * gw
    parts = []
    for channel, classes in enumerate(LABEL_CLASSES):
        counts = np.bincount(token * classes + maps[..., channel].ravel(), minlength=n * classes)
        parts.append(counts.reshape(n, classes).astype(np.float32) / (block * block))
    boxes = np.zeros((n, BOX_TARGETS), np.float32)
    digits = np.zeros((n, DIGIT_TARGETS), np.float32)
    kinds = parts[0]
    for kind in np.unique(maps[..., 0]):
        if kind == 0:
            continue
        ys, xs = np.nonzero(maps[..., 0] == kind)
        shows = (kinds[:, kind] > 0) & (kinds[:, kind] == kinds[:, 1:].max(axis=1))
        box = (xs.min() / w, ys.min() / h, (xs.max() + 1) / w, (ys.max() + 1) / h)
        boxes[shows] = (*box, 1.0)
        written = [min(1000, round(v * 1000 / BOX_STEP) * BOX_STEP) for v in box]
        digits[shows] = [d for v in written for d in (v // 100, v // 10 % 10)]
    parts.append(boxes)
    r, c = np.divmod(np.arange(n), gw)
    parts.append(np.stack([(c + 0.5) / gw, (r + 0.5) / gh], axis=1).astype(np.float32))
    parts.append(digits)
    return np.concatenate(parts, axis=1)


def aux_loss(logits, targets):
    """Soft cross-entropy per label map, the squared errors of the shape's box (on the tokens
    that show a shape) and of the position (each x 10, so it weighs about as much as a label map),
    and the cross-entropy of the box's written digits (on the tokens that show a shape), averaged
    over tokens and terms."""
    import torch

    from .data import LABEL_CLASSES

    total, start = 0.0, 0
    for classes in LABEL_CLASSES:
        part = slice(start, start + classes)
        total = total - (targets[:, part] * torch.log_softmax(logits[:, part], dim=-1)).sum(-1).mean()
        start += classes
    box, shows = slice(start, start + BOX_TARGETS - 1), targets[:, start + BOX_TARGETS - 1]
    error = (torch.sigmoid(logits[:, box]) - targets[:, box]).pow(2).sum(-1)
    total = total + 10 * (error * shows).sum() / shows.sum().clamp(min=1)
    where = slice(start + BOX_TARGETS, start + BOX_TARGETS + POSITION_TARGETS)
    total = total + 10 * (torch.sigmoid(logits[:, where]) - targets[:, where]).pow(2).sum(-1).mean()
    column = start = where.stop  # targets: one class index per digit; logits: the classes of each
    digits = 0.0
    for _ in range(4):
        for classes in DIGIT_CLASSES:
            ce = torch.nn.functional.cross_entropy(logits[:, start:start + classes], targets[:, column].long(),
                                                   reduction="none")
            digits = digits + (ce * shows).sum() / shows.sum().clamp(min=1)
            column, start = column + 1, start + classes
    return (total + digits / 4) / (len(LABEL_CLASSES) + 3)


def answer_losses(model, batch) -> tuple:
    """(the loss to train on, the plain next-token loss on the answers). With ``loss_weights`` in the
    batch (`Batcher`'s ``box_weight``), each answer token's cross-entropy is weighted by it, still
    divided by the number of answer tokens; without, both are the model's own loss."""
    import torch

    weights = batch.pop("loss_weights", None)
    if weights is None:
        loss = model(**batch).loss
        return loss, loss
    labels = batch.pop("labels")
    logits = model(**batch).logits[:, :-1]
    target = labels[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1),
                                           ignore_index=-100, reduction="none")
    count = (target != -100).sum().clamp(min=1)
    return (ce * weights[:, 1:].reshape(-1)).sum() / count, ce.sum() / count


def readout_targets(tok, labels, coordinate) -> tuple:
    """Where the language model predicts a coordinate digit, and the box it is writing: (index,
    targets). ``index`` holds (row, position) of each hidden state whose next token is a digit of a
    grounding answer's box (``coordinate`` marks those digits among ``labels``); ``targets`` that
    box, x1, y1, x2, y2 relative to the image (0-1). Digits next to each other form one number and
    each four numbers one box, in the order the answer writes them."""
    import torch

    index, targets = [], []
    for row in range(labels.shape[0]):
        where = torch.nonzero(coordinate[row]).flatten().tolist()
        numbers: list[list[int]] = []
        for pos in where:
            if numbers and numbers[-1][-1] == pos - 1:
                numbers[-1].append(pos)
            else:
                numbers.append([pos])
        for b in range(len(numbers) // 4):
            parts = numbers[4 * b:4 * b + 4]
            box = [int(tok.decode(labels[row, p])) / 1000 for p in parts]
            for p in (pos for part in parts for pos in part):
                index.append((row, p - 1))
                targets.append(box)
    return (torch.tensor(index, dtype=torch.long).reshape(-1, 2),
            torch.tensor(targets, dtype=torch.float32).reshape(-1, 4))


class Batcher:
    """Samples to padded model inputs, through the same preprocessing as serving."""

    def __init__(self, tokenizer, spec, image_token_id: int, targets: bool = False, video_spec=None,
                 video_token_id: int = -1, box_weight: float = 1.0, readout: bool = False):
        self.tok, self.spec, self.image_token_id = tokenizer, spec, image_token_id
        self.video_spec, self.video_token_id = video_spec, video_token_id
        self.pad = tokenizer.pad_token_id
        self.targets = targets
        self.box_weight = box_weight
        self.readout = readout
        vocab = tokenizer.get_vocab()
        self.digit_ids = [vocab[d] for d in "0123456789"]
        self.underscore_id = vocab["_"]

    def encode(self, sample, extra=()):
        """Token ids and labels (-100 outside the answers) of a chat about one image or clip: the
        sample's question and answer, then each (question, answer) of ``extra`` as a further turn.
        A clip (`clips.Clip`) is read through the serving path's video decoder and sampler."""
        from ..engine.media import images as I
        from ..engine.media import video as V
        from ..engine.prompt import build_prompt

        is_clip = isinstance(sample, Clip)
        if is_clip:
            assert self.video_spec is not None, "a Batcher for clips needs the video spec"
            p = V.load(sample.data, self.video_spec, frame_pixels=VIDEO_FRAME_PIXELS)
        else:
            p = I.prepare(sample.image, self.spec)
        chat: list[dict] = []
        ids: list[int] = []
        labels: list[int] = []
        for k, (question, answer) in enumerate([(sample.question, sample.answer), *extra]):
            content = [{"type": "video" if is_clip else "image"}] if k == 0 else []
            chat.append({"role": "user", "content": content + [{"type": "text", "text": question}]})
            if is_clip:
                prompt = build_prompt(self.tok, chat, [], [], [(V.placeholder(p), p.grid_thw)]).input_ids
            else:
                prompt = build_prompt(self.tok, chat, [p.num_tokens], [p.grid_thw]).input_ids
            if prompt[:len(ids)] != ids:  # the template re-tokenised an earlier turn: stop here
                break
            reply = self.tok(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
            labels += [-100] * (len(prompt) - len(ids)) + reply
            ids = prompt + reply
            chat.append({"role": "assistant", "content": answer})
        return ids, labels, p

    def __call__(self, samples, extras=None):
        import torch

        rows = [self.encode(s, e) for s, e in zip(samples, extras or [()] * len(samples))]
        length = max(len(seq) for seq, _, _ in rows)
        ids = torch.full((len(rows), length), self.pad, dtype=torch.long)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, (seq, target, _) in enumerate(rows):
            ids[i, :len(seq)] = torch.tensor(seq)
            labels[i, :len(seq)] = torch.tensor(target)
            mask[i, :len(seq)] = 1
        pictures = [(s, p) for s, (_, _, p) in zip(samples, rows) if not isinstance(s, Clip)]
        clips = [p for s, (_, _, p) in zip(samples, rows) if isinstance(s, Clip)]
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels,
                 "mm_token_type_ids": (ids == self.image_token_id).int() + 2 * (ids == self.video_token_id).int()}
        # the only digits a shape picture's answers write are a grounding answer's coordinates and
        # the 2 of "bbox_2d" (the one after "_")
        shapes = torch.tensor([not isinstance(s, Clip) and bool(s.objects) for s in samples])
        after_underscore = torch.zeros_like(labels, dtype=torch.bool)
        after_underscore[:, 1:] = labels[:, :-1] == self.underscore_id
        coordinate = torch.isin(labels, torch.tensor(self.digit_ids)) & ~after_underscore & shapes[:, None]
        if self.box_weight != 1.0:
            batch["loss_weights"] = 1.0 + (self.box_weight - 1.0) * coordinate.float()
        if self.readout:
            batch["readout_index"], batch["readout_targets"] = readout_targets(self.tok, labels, coordinate)
        if pictures:
            batch["pixel_values"] = torch.from_numpy(np.concatenate([p.pixel_values for _, p in pictures]))
            batch["image_grid_thw"] = torch.tensor([list(p.grid_thw) for _, p in pictures])
        if clips:
            batch["pixel_values_videos"] = torch.from_numpy(np.concatenate([p.pixel_values for p in clips]))
            batch["video_grid_thw"] = torch.tensor([list(p.grid_thw) for p in clips])
        if self.targets and pictures:
            block = self.spec.patch_size * self.spec.merge_size
            batch["token_targets"] = torch.from_numpy(
                np.concatenate([token_targets(s, p.size, block) for s, p in pictures]))
        return batch


def training_stream(seed: int, batch_size: int, extra_turns: int = 2, focus: tuple[str, ...] = (),
                    mix: str = "classic", video_share: float = 0.0,
                    focus_share: float = 0.5) -> Iterator[tuple[list, list]]:
    """(samples, follow-up turns) of every training step, all drawn from one generator of ``seed``.

    The only source of training images: a test replays it to check that held-out images are not
    among them. With ``focus``, ``focus_share`` of the samples ask one of those tasks (the rest follow the usual
    mix). ``mix`` "varied": CLASSIC_SHARE of the samples from the classic generator, the rest drawn
    in `render.IN_STYLE` with the training phrasings. ``video_share`` of the samples are clips
    (`clips.make_clip`, no follow-up turns); with 0 no draw is spent on them, so the streams of
    runs without clips are what they were. ``focus_share`` is the share of samples drawn from
    ``focus`` (a task named twice is drawn twice as often).
    """
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}; expected one of {MIXES}")
    rng = np.random.default_rng(seed)

    def one():
        if video_share and rng.random() < video_share:
            return make_clip(rng)
        task = focus[int(rng.integers(len(focus)))] if focus and rng.random() < focus_share else None
        if mix == "classic":
            return make_sample(rng, task)
        if rng.random() < CLASSIC_SHARE and task != "locate":
            return make_sample(rng, task)
        return make_styled_sample(rng, task=task)

    pool = "preset" if mix == "classic" else "train"
    while True:
        samples = [one() for _ in range(batch_size)]
        yield samples, [[] if isinstance(s, Clip) else follow_ups(rng, s, extra_turns, pool) for s in samples]


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
          warmup: int = 100, aux_weight: float = 1.0, extra_turns: int = 2, focus: tuple[str, ...] = (),
          mix: str = "classic", video_share: float = 0.0, save_every: int = 0, box_weight: float = 1.0,
          focus_share: float = 0.5, readout_weight: float = 0.0, stop_at: int = 0) -> dict:
    import torch
    from tqdm import tqdm
    from transformers import Qwen3VLForConditionalGeneration

    from ..engine.media import images as I
    from ..build.checkpoints import (
        make_config,
        make_model,
        preprocessor_config,
        real_architecture,
        token_ids,
    )
    from ..build.tokenizer import build_tokenizer

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    texts = corpus_texts()
    tok = build_tokenizer(VOCAB_LIMIT, keep_texts=texts)
    tok.pad_token = "<|endoftext|>"
    ids = token_ids(tok)
    config = make_config(DEMO_SIZES, vocab_size=(len(tok) + 63) // 64 * 64, token_ids=ids)
    if init is not None:  # continue from a checkpoint made by this script
        from transformers import AutoTokenizer

        model = Qwen3VLForConditionalGeneration.from_pretrained(str(init), dtype=torch.float32)
        adopt_vocabulary(model, AutoTokenizer.from_pretrained(str(init)), tok)
    else:
        model = Qwen3VLForConditionalGeneration(config)
    model.train()
    pre = preprocessor_config(real_architecture())
    pre.update(DEMO_PREPROCESSOR)
    spec = I.ImageSpec.from_preprocessor_config(pre)
    from ..engine.media.video import VideoSpec

    batcher = Batcher(tok, spec, ids["image_token_id"], targets=aux_weight > 0,
                      video_spec=VideoSpec.from_checkpoint(out, pre), video_token_id=ids["video_token_id"],
                      box_weight=box_weight, readout=readout_weight > 0)
    # Training aid, not part of the checkpoint: a linear probe on the encoder's output tokens
    # predicts what lies under each token (shape, colour, character) and where the token is, read
    # through a hook.
    from .data import LABEL_CLASSES

    probe = torch.nn.Linear(config.vision_config.out_hidden_size,
                            sum(LABEL_CLASSES) + BOX_TARGETS + POSITION_TARGETS + 4 * sum(DIGIT_CLASSES))
    tokens: list = []  # the encoder's output per call: a batch's pictures first, then its clips
    model.model.visual.merger.register_forward_hook(lambda _m, _i, out: tokens.append(out))
    # Training aid on the language model's side (`--readout-weight`): where the answer writes a
    # box's digits, a linear head on the last hidden state regresses the box itself, so the model
    # learns to carry the coordinates it reads from the picture, ordered, not only their digit tokens.
    readout = torch.nn.Linear(config.text_config.hidden_size, 4)
    states: list = []
    params = list(model.named_parameters()) + [("probe." + n, p) for n, p in probe.named_parameters()]
    if readout_weight > 0:
        model.lm_head.register_forward_pre_hook(lambda _m, args: states.append(args[0]))
        params += [("readout." + n, p) for n, p in readout.named_parameters()]
    decay = [p for n, p in params if p.ndim >= 2]
    no_decay = [p for n, p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98))
    stream = training_stream(seed, batch_size, extra_turns, focus, mix, video_share, focus_share)
    losses: list[float] = []
    token_losses: list[float] = []
    readout_losses: list[float] = []
    t0 = time.time()
    previous = json.loads((init / "training.json").read_text()) if init and (init / "training.json").is_file() else None

    def save(done: int) -> dict:
        model.eval()
        out.mkdir(parents=True, exist_ok=True)
        make_model(out, DEMO_SIZES, vocab_limit=VOCAB_LIMIT, keep_texts=texts, model=model,
                   preprocessor=DEMO_PREPROCESSOR)
        info = {"steps": done, "steps_planned": steps, "seed": seed, "batch_size": batch_size, "lr": lr,
                "warmup": warmup, "aux_weight": aux_weight, "extra_turns": extra_turns, "focus": list(focus),
                "mix": mix, "video_share": video_share, "box_weight": box_weight, "focus_share": focus_share,
                "readout_weight": readout_weight,
                "final_readout_loss": float(np.mean(readout_losses[-100:])) if readout_losses else None,
                "minutes": (time.time() - t0) / 60, "continued_from": previous,
                "first_loss": float(np.mean(losses[:5])), "final_loss": float(np.mean(losses[-100:])),
                "final_token_loss": float(np.mean(token_losses[-100:])) if token_losses else None,
                "params": sum(p.numel() for p in model.parameters())}
        (out / "training.json").write_text(json.dumps(info, indent=2))
        plot_loss(losses, out / "loss.png")
        return info

    bar = tqdm(range(steps), desc="train-demo", unit="step")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        batch = batcher(*next(stream))
        targets = batch.pop("token_targets", None)
        index, boxes = batch.pop("readout_index", None), batch.pop("readout_targets", None)
        tokens.clear()
        states.clear()
        loss, answer_loss = answer_losses(model, batch)
        if index is not None and len(index):
            read = torch.sigmoid(readout(states[0][index[:, 0], index[:, 1]]))
            readout_loss = 10 * (read - boxes).pow(2).sum(-1).mean()
            loss = loss + readout_weight * readout_loss
            readout_losses.append(readout_loss.item())
        if targets is not None:
            token_loss = aux_loss(probe(tokens[0]), targets)
            loss = loss + aux_weight * token_loss
            token_losses.append(token_loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        opt.step()
        losses.append(answer_loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}",
                            **({"token_loss": f"{np.mean(token_losses[-50:]):.3f}"} if token_losses else {}),
                            **({"readout": f"{np.mean(readout_losses[-50:]):.3f}"} if readout_losses else {}))
        if stop_at and step + 1 == stop_at:
            return save(stop_at)  # a run stopped early, reproducibly: the rate schedule still follows `steps`
        if save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            save(step + 1)  # a usable checkpoint if the run is stopped early; training.json says how far
            model.train()
    return save(steps)


def refusal(out: Path, seed: int, overwrite_bundled: bool) -> str | None:
    """Why this run must not start, or None: it would replace the shipped model without being asked
    to, or train on the images of a held-out seed."""
    from ..engine.model.checkpoints import bundled_demo_path
    from .evaluate import HELD_OUT_SEEDS

    bundled = bundled_demo_path().resolve()
    target = out.resolve()
    if (target == bundled or bundled in target.parents) and not overwrite_bundled:
        return (f"--out {out} is the bundled demo model ({bundled}); pass --overwrite-bundled to replace it, "
                "or choose another directory")
    if seed in HELD_OUT_SEEDS:
        return f"--seed {seed} draws the held-out evaluation images (seeds {HELD_OUT_SEEDS}); choose another seed"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vlservice train-demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for the new checkpoint")
    ap.add_argument("--overwrite-bundled", action="store_true",
                    help="allow --out to be the bundled demo model (vlservice/assets/demo-model)")
    ap.add_argument("--steps", type=int, default=6500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--init", type=Path, default=None, help="continue training this checkpoint")
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--aux-weight", type=float, default=1.0,
                    help="weight of the per-token shape/colour/character loss on the encoder's output (0: off)")
    ap.add_argument("--extra-turns", type=int, default=2,
                    help="at most this many further questions about each training image, as later chat turns")
    ap.add_argument("--focus", nargs="*", default=[], choices=TASKS,
                    help="draw half the samples from these tasks (for a continuation on the weak ones)")
    ap.add_argument("--mix", default="classic", choices=MIXES,
                    help="classic: the first generator and the presets; varied: mostly the many styles and phrasings")
    ap.add_argument("--video-share", type=float, default=0.0,
                    help="share of the samples that are generated clips (the video task; 0: none)")
    ap.add_argument("--focus-share", type=float, default=0.5,
                    help="share of the samples drawn from --focus (name a task twice to draw it twice as often)")
    ap.add_argument("--box-weight", type=float, default=1.0,
                    help="weight of a grounding answer's coordinate digits in the answer loss (1: plain loss)")
    ap.add_argument("--readout-weight", type=float, default=0.0,
                    help="weight of the box regression on the language model's state where it writes a box (0: off)")
    ap.add_argument("--stop-at", type=int, default=0,
                    help="end the run after this many steps, its learning-rate schedule still that of --steps (0: no)")
    ap.add_argument("--save-every", type=int, default=0,
                    help="also write the checkpoint every this many steps (0: only at the end)")
    args = ap.parse_args(argv)
    reason = refusal(args.out, args.seed, args.overwrite_bundled)
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    from ..config import _physical_cores

    info = train(args.out, args.steps, args.seed, args.batch_size, args.lr, args.threads or _physical_cores(),
                 args.init, args.warmup, args.aux_weight, args.extra_turns, tuple(args.focus), args.mix,
                 args.video_share, args.save_every, args.box_weight, args.focus_share, args.readout_weight,
                 args.stop_at)
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
