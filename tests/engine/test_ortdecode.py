"""Decode steps in ONNX Runtime (`VL_LLM_QUANT=int4`): the graph ONNX Runtime GenAI's model builder
writes from the real tiny checkpoint, fed the KV cache our PyTorch prefill wrote."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import png_bytes, scene
from vlservice.engine.prepare import chat_prompt
from vlservice.engine.types import ChatRequest, ImageInput, Message, Sampling

QUESTION = "What is in this image?"


def _prefilled(svc, picture: int):
    """A prompt (with picture number `picture`, or text only for -1) prefilled by the PyTorch LLM:
    (kv, position, first token)."""
    from vlservice.engine import images as I

    media, parts = [], [QUESTION]
    if picture >= 0:
        p = I.prepare(I.decode(png_bytes(scene(100 + 20 * picture, 160, seed=picture)), svc.limits), svc.spec,
                      svc.settings.detail_low_pixels)
        media, parts = [p], [ImageInput(b""), QUESTION]
    prompt = chat_prompt(svc.tokenizer, [Message("user", parts)], media)
    feats = [svc.encoder(p.pixel_values, p.grid_thw) for p in media]
    (embeds, positions, mask, deepstack), pos = svc.inputs.prefill_inputs(prompt, feats)
    kv = svc.lean.new_kv(embeds.shape[1] + 16)
    logits = svc.lean.prefill(kv, embeds, positions, mask, deepstack)
    return kv, pos, int(logits.argmax())


@pytest.mark.slow  # over 10 s: out of the --fast tier
def test_the_onnx_decoder_continues_pytorchs_prefill_alone_and_batched(service_for, tiny_model_dir, cache_dir):
    """The unquantised graph (the same builder, fp32) decodes what PyTorch decodes from the same
    caches: three sequences of different lengths and M-RoPE offsets in one batch (their caches moved
    into one arena), then members leave (their caches copied out, intact) and the rest go on."""
    from vlservice.engine.lm import SeqPos
    from vlservice.engine.ortdecode import OrtDecoder, ensure_decoder

    svc = service_for("onnx-int8")
    path, stats = ensure_decoder(tiny_model_dir, cache_dir, "fp32")
    assert path.is_file() and stats["file_bytes"] > 0
    onnx = OrtDecoder(path, svc.lean.embed, threads=2)
    with torch.inference_mode():
        seqs = [_prefilled(svc, picture) for picture in (0, -1, 2)]
        assert len({kv.length for kv, _, _ in seqs}) == 3 and any(pos.delta for _, pos, _ in seqs)
        ref = [(kv, pos) for kv, pos, _ in seqs]
        got = [(copy.deepcopy(kv), SeqPos(pos.next_pos, pos.delta)) for kv, pos, _ in seqs]
        for kv, _ in got:
            kv.reserve(kv.length + 16)
        tokens = [t for _, _, t in seqs]

        def step(rows):
            want = svc.lean.decode([tokens[r] for r in rows], [ref[r][0] for r in rows], [ref[r][1] for r in rows])
            have = onnx.decode([tokens[r] for r in rows], [got[r][0] for r in rows], [got[r][1] for r in rows])
            assert torch.allclose(have, want, atol=1e-4), float((have - want).abs().max())
            assert torch.equal(have.argmax(-1), want.argmax(-1))
            for r, t in zip(rows, want.argmax(-1).tolist()):
                tokens[r] = t

        for _ in range(4):
            step([0, 1, 2])
        onnx.release(got[2][0])  # the last row leaves: the first rows go on in place
        for _ in range(2):
            step([0, 1])
        onnx.release(got[0][0])  # the first row leaves: the next batch moves into a new arena
        step([1])
        for _ in range(2):
            step([0, 2])  # the ones that left go on, from their own copies
        step([1])
    for (kv_ref, pos_ref), (kv, pos) in zip(ref, got):
        assert kv.length == kv_ref.length and pos.next_pos == pos_ref.next_pos
        for i in range(kv.layers):
            assert torch.allclose(kv.keys[i][:, :kv.length], kv_ref.keys[i][:, :kv.length], atol=1e-4)
            assert torch.allclose(kv.values[i][:, :kv.length], kv_ref.values[i][:, :kv.length], atol=1e-4)


def _request(picture: int, **sampling) -> ChatRequest:
    parts = [ImageInput(png_bytes(scene(100 + 4 * (picture % 5), 160, seed=picture))), QUESTION] if picture >= 0 \
        else ["Say something."]
    return ChatRequest([Message("user", parts)], Sampling(**sampling), result_cache=False)


@pytest.mark.slow
def test_int4_answers_batched_as_alone_and_a_cancelled_one_frees_its_slot(settings_for):
    """The served 4-bit path: prompts through the INT8 LLM, tokens through ONNX Runtime; batched
    answers (greedy and seeded, mixed lengths, prompts riding with running tokens) equal the answers
    given one at a time, and a cancelled request leaves while the others finish."""
    from vlservice.engine.ortdecode import SplitLM
    from vlservice.engine.service import load_service

    common = dict(llm_quant="int4", kv_cache_mb=0, queue_size=16, warmup=True, disk_cache_mb=0)
    one = load_service(settings_for(max_batch=1, **common))
    many = load_service(settings_for(max_batch=6, prefill_chunk=16, **common))
    try:
        assert isinstance(many.lean, SplitLM) and many.decoder_stats["file_bytes"] > 0
        specs = [(i if i % 4 else -1, {"max_tokens": 4 + (i * 5) % 13, "min_tokens": (i % 3) * 2,
                                       **({"temperature": 0.9, "seed": i} if i % 3 == 1 else {})})
                 for i in range(9)]
        alone = [one.chat(_request(p, **s)) for p, s in specs]
        victim = many.submit(_request(30, max_tokens=300, min_tokens=300))
        gens = [many.submit(_request(p, **s)) for p, s in specs]
        last, seen = None, 0
        for ev in victim.events():
            seen += ev.kind == "delta"
            if seen == 3:
                victim.cancel()
            if ev.kind in ("done", "error"):
                last = ev
                break
        assert last is not None and last.kind == "error" and last.error.code == "cancelled"
        together = [g.result() for g in gens]
        for (_, s), a, b in zip(specs, alone, together):
            assert (a["text"], a["finish_reason"], a["usage"]) == (b["text"], b["finish_reason"], b["usage"]), s
        stats = many.scheduler.stats()
        assert max(stats["batch_sizes"]) >= 3 and stats["mixed_steps"] > 0
        assert many.running() == 0
    finally:
        one.close()
        many.close()
