"""`train-demo` itself: a short real run makes a checkpoint the server loads, reproducibly from its seed,
with the per-token training aid left out of the checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from vlservice.demo.train import train

    root = tmp_path_factory.mktemp("train")
    a = train(root / "a", steps=40, seed=5, batch_size=4, lr=3e-3, threads=2, warmup=5)
    # b also writes its checkpoint half-way (--save-every): that must not change what it learns
    b = train(root / "b", steps=40, seed=5, batch_size=4, lr=3e-3, threads=2, warmup=5, save_every=20)
    # c is a's run stopped early (--stop-at): its rate schedule is a's, and it ends half-way
    c = train(root / "c", steps=40, seed=5, batch_size=4, lr=3e-3, threads=2, warmup=5, stop_at=20)
    return root, a, b, c


@pytest.mark.slow
def test_training_learns_and_is_reproducible(runs):
    root, a, b, c = runs
    assert a["aux_weight"] > 0 and a["final_token_loss"] is not None
    assert a["first_loss"] - a["final_loss"] > 1.0  # the answer loss falls (final: mean of all 40 steps)
    wa, wb = load_file(str(root / "a" / "model.safetensors")), load_file(str(root / "b" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)  # same seed, same weights (b saved half-way too)
    assert not any("probe" in k for k in wa)  # the training aid is not part of the model
    assert (root / "a" / "loss.png").stat().st_size > 1000
    saved = json.loads((root / "a" / "training.json").read_text())
    assert saved["steps"] == saved["steps_planned"] == 40 and saved["seed"] == 5
    stopped = json.loads((root / "c" / "training.json").read_text())
    assert (stopped["steps"], stopped["steps_planned"]) == (20, 40) == (c["steps"], c["steps_planned"])
    wc = load_file(str(root / "c" / "model.safetensors"))
    assert wc.keys() == wa.keys() and not all(np.array_equal(wa[k], wc[k]) for k in wa)


@pytest.mark.slow
def test_trained_checkpoint_serves(runs, tmp_path):
    from vlservice.config import Settings
    from vlservice.demo.data import encode_png, make_sample
    from vlservice.engine.types import Sampling
    from vlservice.engine.types import ChatRequest, ImageInput, Message
    from vlservice.engine.service import load_service

    root, *_ = runs
    # PyTorch vision: the ONNX export of this architecture is the bundled model's, which every server test makes
    svc = load_service(Settings(model=str(root / "a"), cache_dir=str(tmp_path), threads=2, disk_cache_mb=0,
                                vision_backend="torch"))
    s = make_sample(np.random.default_rng(0), task="count", lang="en")
    out = svc.chat(ChatRequest([Message("user", [ImageInput(encode_png(s.image)), s.question])],
                               Sampling(max_tokens=8)))
    assert out["usage"]["completion_tokens"] >= 1 and isinstance(out["text"], str)


def test_batches_pack_follow_up_turns_and_label_only_the_answers():
    from transformers import AutoTokenizer

    from vlservice.engine.media import images as I
    from vlservice.demo.data import follow_ups, make_sample
    from vlservice.demo.train import DEMO_PREPROCESSOR, Batcher
    from vlservice.engine.model.checkpoints import bundled_demo_path
    from vlservice.build.checkpoints import preprocessor_config, real_architecture

    tok = AutoTokenizer.from_pretrained(str(bundled_demo_path()))
    pre = preprocessor_config(real_architecture())
    pre.update(DEMO_PREPROCESSOR)
    spec = I.ImageSpec.from_preprocessor_config(pre)
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    batcher = Batcher(tok, spec, image_id, targets=True)
    rng = np.random.default_rng(4)
    samples = [make_sample(rng) for _ in range(8)]
    extras = [follow_ups(rng, s, 3) for s in samples]
    assert any(extras)
    batch = batcher(samples, extras)
    for i, (s, extra) in enumerate(zip(samples, extras)):
        ids, labels = batch["input_ids"][i], batch["labels"][i]
        answers = [a for _, a in [(s.question, s.answer), *extra]]
        assert tok.decode(labels[labels != -100]) == "".join(a + "<|im_end|>" for a in answers)
        text = tok.decode(ids[batch["attention_mask"][i] == 1])
        assert text.count("<|im_start|>user") == len(answers) == text.count("<|im_start|>assistant")
        assert text.count("<|vision_start|>") == 1  # one image, asked about several times
    n_image = int((batch["input_ids"] == image_id).sum())
    assert n_image == int(batch["image_grid_thw"].prod(dim=1).sum()) // 4 == batch["token_targets"].shape[0]


@pytest.mark.slow
def test_continuing_with_a_grown_vocabulary_keeps_what_the_model_knew():
    """`--init` with a larger vocabulary: every token's id moves, the model's answers about the
    presets must not (its loss on them stays where it was), and the image token follows. The shipped
    model already has the full vocabulary, so it is first cut down to the presets' own (as the
    model before the phrasings had), then grown back."""
    import torch
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    from vlservice.demo.data import iter_samples
    from vlservice.demo.train import DEMO_PREPROCESSOR, VOCAB_LIMIT, Batcher, adopt_vocabulary, corpus_texts
    from vlservice.engine.media import images as I
    from vlservice.engine.model.checkpoints import bundled_demo_path
    from vlservice.build.checkpoints import preprocessor_config, real_architecture, token_ids
    from vlservice.build.tokenizer import build_tokenizer

    shipped_tok = AutoTokenizer.from_pretrained(str(bundled_demo_path()))
    presets = sorted({t for s in iter_samples(12345, 4000) for t in (s.question, s.answer)})
    old_tok = build_tokenizer(VOCAB_LIMIT, keep_texts=presets)
    new_tok = build_tokenizer(VOCAB_LIMIT, keep_texts=corpus_texts())
    assert len(new_tok) > len(old_tok) and new_tok.get_vocab() == shipped_tok.get_vocab()
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(bundled_demo_path()), dtype=torch.float32).eval()
    adopt_vocabulary(model, shipped_tok, old_tok)
    pre = preprocessor_config(real_architecture())
    pre.update(DEMO_PREPROCESSOR)
    spec = I.ImageSpec.from_preprocessor_config(pre)
    samples = list(iter_samples(31, 8))

    def loss(tok):
        with torch.no_grad():
            return model(**Batcher(tok, spec, token_ids(tok)["image_token_id"])(samples)).loss.item()

    before = loss(old_tok)
    adopt_vocabulary(model, old_tok, new_tok)
    assert model.config.image_token_id == token_ids(new_tok)["image_token_id"] != token_ids(old_tok)["image_token_id"]
    assert model.get_input_embeddings().weight.shape[0] == (len(new_tok) + 63) // 64 * 64
    assert loss(new_tok) < before + 0.05  # the answers it knew are still its answers
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()  # still tied


def test_clips_join_a_batch_with_the_serving_paths_prompt_and_train_the_model():
    """A generated clip in a training batch is read as the server reads an upload (sampled at 2 fps,
    `<t seconds>` before each temporal patch), labels cover its answer alone, and a batch of a
    picture and a clip runs forward and backward through the real model (the probe's targets are
    the picture's tokens only)."""
    import torch
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    from vlservice.demo.clips import make_clip
    from vlservice.demo.data import make_sample
    from vlservice.demo.train import DEMO_PREPROCESSOR, VIDEO_FRAME_PIXELS, Batcher
    from vlservice.engine.media import images as I
    from vlservice.engine.media import video as V
    from vlservice.engine.model.checkpoints import bundled_demo_path
    from vlservice.build.checkpoints import preprocessor_config, real_architecture, token_ids

    path = bundled_demo_path()
    tok = AutoTokenizer.from_pretrained(str(path))
    pre = preprocessor_config(real_architecture())
    pre.update(DEMO_PREPROCESSOR)
    ids = token_ids(tok)
    vspec = V.VideoSpec.from_checkpoint(path, pre)
    batcher = Batcher(tok, I.ImageSpec.from_preprocessor_config(pre), ids["image_token_id"], targets=True,
                      video_spec=vspec, video_token_id=ids["video_token_id"])
    rng = np.random.default_rng(7)
    clip, picture = make_clip(rng, lang="en"), make_sample(rng, task="count")
    batch = batcher([picture, clip])
    served = V.load(clip.data, vspec, frame_pixels=VIDEO_FRAME_PIXELS)
    assert 4 <= len(served.frame_indices) <= 10  # 2-5 s at the default 2 fps
    assert batch["video_grid_thw"].tolist() == [list(served.grid_thw)]
    np.testing.assert_array_equal(batch["pixel_values_videos"].numpy(), served.pixel_values)
    row, labels = batch["input_ids"][1], batch["labels"][1]
    text = tok.decode(row[batch["attention_mask"][1] == 1])
    assert text.count("<|video_pad|>") == served.num_tokens == int((row == ids["video_token_id"]).sum())
    assert text.count(" seconds>") == len(served.timestamps) and "<|image_pad|>" not in text
    assert tok.decode(labels[labels != -100]) == clip.answer + "<|im_end|>"
    assert (batch["mm_token_type_ids"][1] == 2).sum() == served.num_tokens
    assert batch["token_targets"].shape[0] == int((batch["input_ids"] == ids["image_token_id"]).sum())
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
    loss = model(**{k: v for k, v in batch.items() if k != "token_targets"}).loss
    loss.backward()
    assert torch.isfinite(loss) and model.model.visual.patch_embed.proj.weight.grad.abs().sum() > 0


def test_coordinate_digits_weigh_more_in_the_answer_loss_and_nothing_else_does():
    """`--box-weight`: the digits of a grounding answer's boxes weigh more; an OCR answer's digits,
    every other token and the plain loss (the model's own) stay as they were."""
    import torch
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    from vlservice.demo.data import make_sample
    from vlservice.demo.render import make_styled_sample
    from vlservice.demo.data import boxes_1000
    from vlservice.demo.train import DEMO_PREPROCESSOR, Batcher, answer_losses
    from vlservice.engine.media import images as I
    from vlservice.engine.model.checkpoints import bundled_demo_path
    from vlservice.build.checkpoints import preprocessor_config, real_architecture, token_ids

    path = bundled_demo_path()
    tok = AutoTokenizer.from_pretrained(str(path))
    pre = preprocessor_config(real_architecture())
    pre.update(DEMO_PREPROCESSOR)
    spec = I.ImageSpec.from_preprocessor_config(pre)
    rng = np.random.default_rng(8)
    locate = make_styled_sample(rng, task="locate", lang="en")
    ocr = next(s for s in (make_sample(rng, task="ocr") for _ in range(50)) if any(c.isdigit() for c in s.answer))
    samples = [locate, ocr, make_sample(rng, task="count")]
    batch = Batcher(tok, spec, token_ids(tok)["image_token_id"], box_weight=3.0, readout=True)(samples)
    weights, labels = batch["loss_weights"], batch["labels"]
    # --readout-weight: each state that predicts a coordinate digit, with the box being written
    index, boxes = batch.pop("readout_index"), batch.pop("readout_targets")
    assert (index[:, 0] == 0).all() and torch.equal(index[:, 1] + 1, torch.nonzero(weights[0] == 3.0).flatten())
    drawn = [[v / 1000 for v in box] for box in boxes_1000(locate.objects, locate.canvas)]
    assert all(any(b == pytest.approx(d) for d in drawn) for b in boxes.tolist())
    assert len({tuple(b) for b in boxes.tolist()}) == len(drawn)  # every box, each at its own digits
    assert set(weights.unique().tolist()) == {1.0, 3.0}
    heavy = labels[0][weights[0] == 3.0]
    coordinates = "".join(c for c in locate.answer.replace("bbox_2d", "") if c.isdigit())
    assert tok.decode(heavy) == coordinates  # every coordinate digit, not the 2 of "bbox_2d"
    assert (weights[1:] == 1.0).all()  # the card's digits and the count answer: plain weight
    plain = Batcher(tok, spec, token_ids(tok)["image_token_id"])(samples)
    assert "loss_weights" not in plain and torch.equal(plain["labels"], labels)
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        own = model(**plain).loss
        weighted, answer = answer_losses(model, dict(batch))
        same, _ = answer_losses(model, dict(plain))
    assert torch.allclose(answer, own, atol=1e-5) and torch.allclose(same, own)
    assert weighted > answer
