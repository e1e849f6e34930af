"""The language model in ONNX Runtime (`VL_LLM_QUANT=int4`): the graph ONNX Runtime GenAI's model
builder writes from the real tiny checkpoint, adapted to take the images' deepstack features, runs
prompts and answers; its unquantised form gives what PyTorch float32 gives."""

from __future__ import annotations


import pytest
import torch

from conftest import png_bytes, scene
from vlservice.engine.media.prepare import chat_prompt
from vlservice.engine.types import ChatRequest, ImageInput, Message, Sampling

QUESTION = "What is in this image?"


def _inputs(svc, picture: int):
    """A prompt with picture number `picture` (or text only for -1) as the passes' inputs:
    ((embeds, positions, visual mask, deepstack), position)."""
    from vlservice.engine.media import images as I

    media, parts = [], [QUESTION]
    if picture >= 0:
        p = I.prepare(I.decode(png_bytes(scene(100 + 20 * picture, 160, seed=picture)), svc.limits), svc.spec,
                      svc.settings.detail_low_pixels)
        media, parts = [p], [ImageInput(b""), QUESTION]
    prompt = chat_prompt(svc.tokenizer, [Message("user", parts)], media)
    feats = [svc.encoder(p.pixel_values, p.grid_thw) for p in media]
    return svc.inputs.prefill_inputs(prompt, feats)


def _chunked(lm, inputs, cuts):
    """Prefill `inputs` in chunks ending at `cuts` (as `Sequence.chunk` slices them); returns
    (kv, the last chunk's logits)."""
    from vlservice.engine.model.lm import Chunk

    embeds, positions, visual, deepstack = inputs
    kv, a, logits = lm.new_kv(), 0, None
    for b in cuts:
        mask, ds = (visual[:, a:b], None) if visual is not None else (None, None)
        if mask is not None and int(mask.sum()):
            before, inside = int(visual[:, :a].sum()), int(mask.sum())
            ds = [d[before:before + inside] for d in deepstack]
        elif mask is not None:
            mask = None
        logits = lm.step([], [], [], Chunk(kv, embeds[:, a:b], positions[:, :, a:b], mask, ds, b == cuts[-1]))[1]
        a = b
    return kv, logits


@pytest.mark.slow  # over 10 s: out of the --fast tier
def test_the_onnx_graph_runs_prompts_and_answers_as_pytorch_float32(service_for, tiny_model_dir, cache_dir):
    """The unquantised graph (the same builder and adaptation, fp32) against PyTorch float32:
    prompts with and without an image, whole and in chunks that cut through the image, give the
    same logits and caches (and the deepstack inputs matter: without them the logits move); then
    three sequences of different lengths and M-RoPE offsets decode in one batch (their caches moved
    into one arena), members leave (their caches copied out, intact) and the rest go on."""
    from vlservice.engine.model.lm import SeqPos
    from vlservice.engine.model.ortdecode import OrtLM, ensure_decoder

    svc = service_for("onnx-int8")
    path, stats = ensure_decoder(tiny_model_dir, cache_dir, "fp32")
    assert path.is_file() and stats["file_bytes"] > 0
    onnx = OrtLM(path, svc.lean.embed, svc.model.config.text_config, threads=2)
    assert onnx.deepstack == 2  # the tiny model's two layers each take a level
    ref, got, tokens = [], [], []
    with torch.inference_mode():
        for picture in (0, -1, 2):
            inputs, pos = _inputs(svc, picture)
            n = inputs[0].shape[1]
            kv_ref = svc.lean.new_kv()
            want = svc.lean.prefill(kv_ref, *inputs)
            kv, whole = _chunked(onnx, inputs, [n])
            assert torch.allclose(whole, want, atol=1e-4), float((whole - want).abs().max())
            assert int(whole.argmax()) == int(want.argmax())
            if picture >= 0:  # chunks that begin and end inside the image
                image = inputs[2][0].nonzero().view(-1)
                cuts = [int(image[3]), int(image[-5]), n]
                kv, parts = _chunked(onnx, inputs, cuts)
                assert torch.allclose(parts, want, atol=1e-4), float((parts - want).abs().max())
                _, blind = _chunked(onnx, (inputs[0], inputs[1], None, None), [n])
                assert not torch.allclose(blind, want, atol=1e-3)  # the features do enter the graph
            for i in range(kv.layers):
                assert torch.allclose(kv.keys[i][:, :n], kv_ref.keys[i][:, :n], atol=1e-4)
                assert torch.allclose(kv.values[i][:, :n], kv_ref.values[i][:, :n], atol=1e-4)
            kv.reserve(n + 16)
            ref.append((kv_ref, pos))
            got.append((kv, SeqPos(pos.next_pos, pos.delta)))
            tokens.append(int(want.argmax()))
        assert len({kv.length for kv, _ in ref}) == 3 and any(pos.delta for _, pos in ref)

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
    """The served 4-bit path, one graph for prompts and answers and no PyTorch copy of the language
    model; batched answers (greedy and seeded, mixed lengths, prompt chunks between running tokens)
    equal the answers given one at a time, and a cancelled request leaves while the others finish."""
    from vlservice.engine.model.ortdecode import OrtLM
    from vlservice.engine.service import load_service

    common = dict(llm_quant="int4", kv_cache_mb=0, queue_size=16, warmup=True, disk_cache_mb=0)
    one = load_service(settings_for(max_batch=1, **common))
    many = load_service(settings_for(max_batch=6, prefill_chunk=16, **common))
    try:
        assert isinstance(many.lean, OrtLM) and many.decoder_stats["file_bytes"] > 0
        text = many.model.model.language_model
        assert all(p.numel() == 0 for p in text.layers.parameters()) and many.model.lm_head.weight.numel() == 0
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


@pytest.mark.slow
def test_int4_a_conversation_cache_hit_answers_as_a_miss(settings_for):
    """One model's answers: a follow-up whose history comes from the conversation cache (KV the
    graph wrote while answering) gets the greedy ids a fresh prefill of the whole history gets."""
    from vlservice.engine.service import load_service

    common = dict(llm_quant="int4", queue_size=4, warmup=False, disk_cache_mb=0, max_batch=2)
    cached = load_service(settings_for(kv_cache_mb=64, **common))
    fresh = load_service(settings_for(kv_cache_mb=0, **common))
    try:
        image = ImageInput(png_bytes(scene(140, 160, seed=7)))
        first = [Message("user", [image, QUESTION])]
        answer = cached.chat(ChatRequest(first, Sampling(max_tokens=12, min_tokens=12), result_cache=False))
        follow = first + [Message("assistant", [answer["text"]]), Message("user", ["And the colours?"])]
        hit = cached.chat(ChatRequest(follow, Sampling(max_tokens=12, min_tokens=12), result_cache=False))
        assert cached.kv.stats()["hits"] >= 1 and cached.kv.stats()["reused_tokens"] > 0
        miss = fresh.chat(ChatRequest(follow, Sampling(max_tokens=12, min_tokens=12), result_cache=False))
        assert hit["text"] == miss["text"] and hit["usage"] == miss["usage"]
    finally:
        cached.close()
        fresh.close()
