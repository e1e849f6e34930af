"""The demo model's reported accuracy is measured on images that no training run drew and that no
decision looked at: the report seed is none of the shipped model's training seeds, nor the
development seed, and its images (the classic table's and the held-out phrasing and out-of-style
sets', with their clips, `vlservice.demo.heldout`) are not among those of the recorded training runs (replayed
exactly from `training.json`, a prefix of each) or of the development set."""

from __future__ import annotations

import hashlib
import json

import pytest

N_REPORT = 500  # docs/demo-model.md's `eval-demo --n 500`
STEPS_PER_RUN = 60  # a prefix of each recorded run: 60 steps x 16 images and clips each


def digest(sample) -> bytes:
    from vlservice.demo.clips import Clip

    if isinstance(sample, Clip):  # a clip is its MP4 bytes (the encoder is deterministic)
        return hashlib.blake2b(sample.data, digest_size=16).digest()
    return hashlib.blake2b(repr(sample.image.shape).encode() + sample.image.tobytes(), digest_size=16).digest()


def recorded_runs() -> list[dict]:
    """The shipped model's training runs, first to last (each `training.json` nests the one it continued)."""
    from vlservice.engine.model.checkpoints import bundled_demo_path

    run, runs = json.loads((bundled_demo_path() / "training.json").read_text()), []
    while run:
        runs.append(run)
        run = run.get("continued_from")
    return runs[::-1]


def test_report_seed_is_no_training_or_development_seed():
    from vlservice.demo.evaluate import DEV_SEED, HELD_OUT_SEEDS, REPORT_SEED
    from vlservice.demo.train import corpus_texts

    runs = recorded_runs()
    assert [r["seed"] for r in runs] == [0, 1, 2, 3, 4, 8, 9]  # docs/demo-model.md's recipe
    assert REPORT_SEED != DEV_SEED and set(HELD_OUT_SEEDS) == {DEV_SEED, REPORT_SEED}
    assert not set(HELD_OUT_SEEDS) & {r["seed"] for r in runs}
    assert corpus_texts.__defaults__[0] not in HELD_OUT_SEEDS  # the tokenizer's texts


@pytest.mark.slow
def test_report_images_were_never_drawn_for_training_or_development():
    from itertools import islice

    from vlservice.demo.clips import iter_clips
    from vlservice.demo.data import iter_samples
    from vlservice.demo.evaluate import DEV_SEED, REPORT_SEED
    from vlservice.demo.heldout import SETS
    from vlservice.demo.render import iter_styled_samples
    from vlservice.demo.train import training_stream

    def held_out(seed):
        images = [digest(s) for s in iter_samples(seed, N_REPORT)]
        for _, style, pool, k in SETS:
            images += [digest(s) for s in iter_styled_samples([seed, k], N_REPORT, style, pool)]
            images += [digest(c) for c in iter_clips([seed, k, 1], max(20, N_REPORT // 4), pool)]  # run_sets' clips
        return images

    report = set(held_out(REPORT_SEED))
    assert len(report) == N_REPORT * (1 + len(SETS)) + N_REPORT // 4 * len(SETS)  # distinct images and clips
    development = set(held_out(DEV_SEED))
    assert not report & development
    for run in recorded_runs():
        stream = training_stream(run["seed"], run["batch_size"], run["extra_turns"], tuple(run.get("focus", ())),
                                 run.get("mix", "classic"), run.get("video_share", 0.0), run.get("focus_share", 0.5))
        seen = {digest(s) for samples, _ in islice(stream, STEPS_PER_RUN) for s in samples}
        assert len(seen) > 0.99 * STEPS_PER_RUN * run["batch_size"]
        assert not report & seen, run["seed"]
