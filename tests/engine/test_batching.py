"""Several conversations at once: the lean forward pass, the scheduler's batched decode and
chunked prefill, on the real tiny checkpoint through the real engine."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from conftest import png_bytes, scene
from vlservice.engine.media.prepare import chat_prompt
from vlservice.engine.types import ChatRequest, ImageInput, Message, Sampling

QUESTION = "What is in this image?"


def request(picture, text=QUESTION, **sampling):
    """A question about picture number `picture` (-1: text only)."""
    parts = [ImageInput(png_bytes(scene(100 + 4 * (picture % 5), 160, seed=picture))), text] if picture >= 0 else [text]
    return ChatRequest([Message("user", parts)], Sampling(**sampling), result_cache=False)


@pytest.fixture(scope="module")
def batched(settings_for):
    from vlservice.engine.service import load_service

    svc = load_service(settings_for(max_batch=8, prefill_chunk=16, kv_cache_mb=0, queue_size=16, warmup=False,
                                    disk_cache_mb=0))
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def one_at_a_time(settings_for):
    from vlservice.engine.service import load_service

    svc = load_service(settings_for(max_batch=1, kv_cache_mb=0, queue_size=16, warmup=False, disk_cache_mb=0))
    yield svc
    svc.close()


def _generic_forward(svc, prompt, feats, steps: int):
    """The model's own language model and LM head over a `DynamicCache`, one token at a time: the
    reference the lean forward must match."""
    from transformers import DynamicCache

    model = svc.model
    lm = model.model.language_model
    cache = DynamicCache(config=model.config.text_config)
    (embeds, mrope, mask, deepstack), pos = svc.inputs.prefill_inputs(prompt, feats)
    text_pos = torch.arange(len(prompt)).view(1, 1, -1)
    with torch.inference_mode():
        out = lm(inputs_embeds=embeds, position_ids=torch.cat([text_pos, mrope], dim=0), cache=cache,
                 use_cache=True, visual_pos_masks=mask, deepstack_visual_embeds=deepstack)
        logits = [model.lm_head(out.last_hidden_state[:, -1]).float()[0]]
        p, delta = pos.next_pos, pos.delta
        for _ in range(steps):
            token = int(logits[-1].argmax())
            ids = torch.tensor([p, p + delta, p + delta, p + delta], dtype=torch.long).view(4, 1, 1)
            out = lm(inputs_embeds=svc.inputs.embed(torch.tensor([[token]], dtype=torch.long)), position_ids=ids,
                     cache=cache, use_cache=True)
            logits.append(model.lm_head(out.last_hidden_state[:, -1]).float()[0])
            p += 1
    return logits


def test_lean_forward_gives_the_generic_forward_bits_at_batch_one(service_for):
    """The lean per-step loop runs the model's own modules in the generic forward's order."""
    from vlservice.engine.media import images as I

    svc = service_for("torch")
    rgb = I.decode(png_bytes(scene(120, 160, seed=3)), svc.limits)
    p = I.prepare(rgb, svc.spec, svc.settings.detail_low_pixels)
    feats = [svc.encoder(p.pixel_values, p.grid_thw)]
    prompt = chat_prompt(svc.tokenizer, [Message("user", [ImageInput(b""), QUESTION])], [p])
    want = _generic_forward(svc, prompt, feats, steps=6)
    (embeds, positions, mask, deepstack), pos = svc.inputs.prefill_inputs(prompt, feats)
    kv = svc.lean.new_kv()
    got = [svc.lean.prefill(kv, embeds, positions, mask, deepstack)]
    for w in want[:-1]:
        got.append(svc.lean.decode([int(w.argmax())], [kv], [pos])[0])
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_a_prompt_chunk_riding_with_running_tokens_gives_what_each_pass_gives_alone(service_for):
    """One pass carrying two streams' next tokens and a chunk of a third sequence's prompt (image
    rows and deepstack inside it) gives each the logits and the cache contents of its own pass."""
    import copy

    from vlservice.engine.media import images as I
    from vlservice.engine.model.lm import Chunk, SeqPos

    svc = service_for("torch")
    lean = svc.lean

    def inputs(seed):
        p = I.prepare(I.decode(png_bytes(scene(120, 160, seed=seed)), svc.limits), svc.spec,
                      svc.settings.detail_low_pixels)
        prompt = chat_prompt(svc.tokenizer, [Message("user", [ImageInput(b""), QUESTION])], [p])
        return svc.inputs.prefill_inputs(prompt, [svc.encoder(p.pixel_values, p.grid_thw)])

    running = []
    for seed in (4, 5):
        (embeds, positions, mask, deepstack), pos = inputs(seed)
        kv = lean.new_kv()
        token = int(lean.prefill(kv, embeds, positions, mask, deepstack).argmax())
        running.append((token, kv, pos))
    (embeds, positions, mask, deepstack), _ = inputs(6)
    kv_new = lean.new_kv()
    cut = int(mask[0].nonzero()[0])  # the text before the image goes first, alone
    lean.prefill(kv_new, embeds[:, :cut], positions[:, :, :cut], logits=False)
    n_vis = int(mask.sum())
    chunk_mask = mask[:, cut:]

    def chunk(kv):
        return Chunk(kv, embeds[:, cut:], positions[:, :, cut:], chunk_mask, [d[:n_vis] for d in deepstack])

    alone_kvs = [copy.deepcopy(kv) for _, kv, _ in running]
    alone_pos = [SeqPos(p.next_pos, p.delta) for _, _, p in running]
    alone = lean.decode([t for t, _, _ in running], alone_kvs, alone_pos)
    alone_kv_new = copy.deepcopy(kv_new)
    alone_chunk = lean.prefill(alone_kv_new, embeds[:, cut:], positions[:, :, cut:], chunk_mask,
                               [d[:n_vis] for d in deepstack])
    together, chunk_logits = lean.step([t for t, _, _ in running], [kv for _, kv, _ in running],
                                       [p for _, _, p in running], chunk(kv_new))
    assert together.shape == alone.shape and chunk_logits.shape == alone_chunk.shape
    assert torch.allclose(together, alone, atol=1e-4) and torch.equal(together.argmax(-1), alone.argmax(-1))
    assert torch.allclose(chunk_logits, alone_chunk, atol=1e-4) and chunk_logits.argmax() == alone_chunk.argmax()
    for (_, kv, pos), kv_alone, pos_alone in zip(running, alone_kvs, alone_pos):
        assert kv.length == kv_alone.length and pos.next_pos == pos_alone.next_pos
        assert torch.allclose(kv.keys[-1][:, :kv.length], kv_alone.keys[-1][:, :kv.length], atol=1e-4)
    assert kv_new.length == alone_kv_new.length == embeds.shape[1]
    assert torch.allclose(kv_new.values[-1][:, :kv_new.length], alone_kv_new.values[-1][:, :kv_new.length], atol=1e-4)


def test_int8_rows_do_not_depend_on_their_batch():
    """Per-row activation scales: a row's INT8 result is the same bits alone or beside a row 20x
    larger (PyTorch's per-tensor dynamic quantisation changed it by up to 29%)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from vlservice.engine.model.linears import make_rows_independent

    torch.manual_seed(0)
    plain = quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(256, 128, bias=False)),
                             {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    row, big = torch.randn(1, 256), 20 * torch.randn(1, 256)
    with torch.inference_mode():
        drift = (plain(torch.cat([row, big]))[:1] - plain(row)).abs().max()
        assert drift > 0  # the trap this guards against is real
        assert make_rows_independent(plain) == 1
        alone = plain(row)
        beside = plain(torch.cat([big, row, -big]))[1:2]
        ref = row @ plain[0].weight().dequantize().T
    assert torch.equal(alone, beside)
    assert (alone - ref).abs().max() / ref.abs().max() < 0.05  # and still the product it stands for


def test_a_row_scaled_int8_linear_reads_its_weights_once():
    """The row-scaled forward subtracts and re-adds the bias; reading it through `bias()` unpacks
    the whole int8 matrix (fbgemm's PackBMatrix::unpack) on every call, which made a real-size INT8
    token take seconds. After the first call the packed weights are never unpacked again, and the
    results keep the bias; new weights (set_weight_bias) bring their own bias."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from vlservice.engine.model.linears import make_rows_independent

    torch.manual_seed(0)
    lin = quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(64, 32)),
                           {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)[0]
    make_rows_independent(torch.nn.Sequential(lin))
    x = torch.randn(3, 64)
    unpacks = []
    params = lin._packed_params
    unpack = params._weight_bias
    params._weight_bias = lambda: unpacks.append(1) or unpack()
    with torch.inference_mode():
        first = lin(x)
        again = [lin(x) for _ in range(5)]
    assert len(unpacks) == 1
    assert all(torch.equal(first, y) for y in again)
    w, b = unpack()
    assert (first - (x @ w.dequantize().T + b)).abs().max() < 0.05 * first.abs().max()
    lin.set_weight_bias(w, b + 10)
    with torch.inference_mode():
        assert torch.allclose(lin(x), first + 10, atol=1e-3)


@pytest.mark.slow  # over 10 s: out of the --fast tier
def test_sixteen_concurrent_requests_answer_as_they_do_alone(batched, one_at_a_time):
    """Mixed lengths, stop strings, min_tokens and seeded sampling: batched answers equal the
    answers given one at a time."""
    specs = []
    for i in range(16):
        s = {"max_tokens": 3 + (i * 5) % 17, "min_tokens": (i % 3) * 2}
        if i % 4 == 1:
            s.update(temperature=0.9, top_p=0.9, seed=100 + i)
        if i % 5 == 2:
            s["stop"] = ("e",)
        specs.append((i if i % 6 else -1, s))
    alone = [one_at_a_time.chat(request(picture, **s)) for picture, s in specs]
    gens = [batched.submit(request(picture, **s)) for picture, s in specs]
    together = [g.result() for g in gens]
    for (_, s), a, b in zip(specs, alone, together):
        assert (a["text"], a["finish_reason"], a["usage"]) == (b["text"], b["finish_reason"], b["usage"]), s
        assert b["usage"]["completion_tokens"] >= min(s["min_tokens"], s["max_tokens"]) or b["finish_reason"] == "stop"
    stats = batched.scheduler.stats()
    sizes = stats["batch_sizes"]
    assert max(sizes) >= 3, sizes  # they really shared decode steps
    steps = stats["step_ms"]  # decode-only step times by batch size, as /api/stats shows them
    assert set(steps) <= set(sizes)
    assert sum(v["steps"] for v in steps.values()) + stats["mixed_steps"] == sum(sizes.values())
    assert stats["mixed_steps"] > 0  # prompts' chunks rode along with running tokens
    assert all(0 < v["forward_ms"] <= v["step_ms"] for v in steps.values())
    assert any(r["timings"]["wait_ms"] > 0 for r in together)  # and waited for each other's prefills


def test_a_cancelled_request_leaves_the_batch_and_the_others_finish(batched, one_at_a_time):
    keep = [request(20 + i, max_tokens=12, min_tokens=12) for i in range(3)]
    want = [one_at_a_time.chat(r)["text"] for r in keep]
    victim = batched.submit(request(30, max_tokens=400, min_tokens=400))
    gens = [batched.submit(r) for r in keep]
    seen = 0
    for ev in victim.events():
        if ev.kind == "delta":
            seen += 1
            if seen == 3:
                victim.cancel()
        if ev.kind in ("done", "error"):
            last = ev
    assert last.kind == "error" and last.error.code == "cancelled"
    assert [g.result()["text"] for g in gens] == want
    assert batched.running() == 0


def test_a_running_stream_keeps_decoding_while_a_new_prompt_prefills(batched):
    """Chunked prefill: tokens of the running stream arrive between the new request's start and
    its first token."""
    runner = batched.submit(request(-1, "Hello", max_tokens=300, min_tokens=300))
    events = []
    lock = threading.Lock()

    def watch(gen, name):
        for ev in gen.events():
            with lock:
                events.append((name, ev.kind))

    t = threading.Thread(target=watch, args=(runner, "runner"))
    t.start()
    while not any(k == "delta" for _, k in list(events)):
        threading.Event().wait(0.01)
    newcomer = batched.submit(ChatRequest([Message("user", [ImageInput(png_bytes(scene(400, 400, seed=5))),
                                                               QUESTION])], Sampling(max_tokens=2), result_cache=False))
    watch(newcomer, "new")
    runner.cancel()
    t.join(30)
    kinds = [e for e in events]
    start = kinds.index(("new", "started"))
    first = kinds.index(("new", "delta")) if ("new", "delta") in kinds else kinds.index(("new", "done"))
    between = [e for e in kinds[start:first] if e == ("runner", "delta")]
    prompt_n = newcomer.work.prompt.input_ids
    assert len(prompt_n) > 3 * batched.settings.prefill_chunk  # several chunks to interleave with
    assert len(between) >= 2, kinds[start:first]


def test_a_follow_up_joining_a_running_batch_reuses_its_conversation(settings_for):
    from vlservice.engine.service import load_service

    svc = load_service(settings_for(max_batch=4, warmup=False, disk_cache_mb=0, result_cache_entries=0))
    try:
        img = ImageInput(png_bytes(scene(130, 130, seed=61)))
        first = svc.chat(ChatRequest([Message("user", [img, QUESTION])], Sampling(max_tokens=6, min_tokens=6)))
        other = svc.submit(request(62, max_tokens=200, min_tokens=200))
        answering, seen = threading.Event(), []

        def consume():
            for ev in other.events():
                seen.append(ev)
                if ev.kind == "delta":
                    answering.set()

        t = threading.Thread(target=consume)
        t.start()
        assert answering.wait(60)  # the other request is decoding when the follow-up comes
        history = [Message("user", [img, QUESTION]), Message("assistant", [first["text"]]),
                   Message("user", ["And what else?"])]
        follow = svc.chat(ChatRequest(history, Sampling(max_tokens=4)))
        assert follow["timings"]["cache_n"] > 0 and follow["timings"]["vision_cache_hit"]
        assert max(svc.scheduler.stats()["batch_sizes"]) >= 2  # it decoded beside the other request
        other.cancel()
        t.join(60)
        assert seen[-1].kind in ("error", "done")
        stats = svc.stats()["batch"]
        assert stats["slots"] == 4 and stats["running"] == 0 and stats["steps"] > 0
    finally:
        svc.close()


def test_waiting_requests_time_out_and_cancel_in_the_queue(settings_for):
    """Beyond the slots requests wait by priority; one that waits too long gets 503, one that is
    cancelled while waiting leaves with `cancelled`."""
    from vlservice.engine.service import load_service

    svc = load_service(settings_for(max_batch=1, queue_size=4, queue_timeout_s=0.5, warmup=False, disk_cache_mb=0))
    try:
        hold = svc.submit(request(-1, "Hello", max_tokens=1000, min_tokens=1000))
        late = svc.submit(request(-1, "Hi", max_tokens=2))
        gone = svc.submit(request(-1, "Hey", max_tokens=2))
        gone.cancel()
        errors = {}
        for name, gen in (("late", late), ("gone", gone)):
            last = [ev for ev in gen.events()][-1]
            errors[name] = last.error.code if last.kind == "error" else last.kind
        assert errors == {"late": "queue_timeout", "gone": "cancelled"}
        hold.cancel()
        assert [ev for ev in hold.events()][-1].error.code == "cancelled"
        assert svc.stats()["counters"]["cancelled"] == 2
    finally:
        svc.close()


def test_kv_of_a_sequence_grows_and_copies_only_what_is_filled():
    import copy

    from vlservice.engine.model.kv import BLOCK, SeqKV

    kv = SeqKV(layers=2, kv_heads=2, head_dim=4)
    for step in range(BLOCK + 3):
        kv.reserve(kv.length + 1)
        for layer in range(2):
            k = torch.full((2, 1, 4), float(step))
            keys, values = kv.write(layer, k, -k)
            assert keys.shape[1] == step + 1
        kv.advance(1)
    assert kv.capacity == 2 * BLOCK and kv.length == BLOCK + 3
    assert np.array_equal(kv.keys[1][0, :, 0].numpy()[:kv.length], np.arange(BLOCK + 3, dtype=np.float32))
    branch = copy.deepcopy(kv)
    branch.truncate(10)
    branch.reserve(11)
    branch.write(0, torch.full((2, 1, 4), -1.0), torch.zeros(2, 1, 4))
    branch.advance(1)
    assert branch.length == 11 and kv.length == BLOCK + 3  # the original is whole
    assert float(kv.keys[0][0, 10, 0]) == 10.0 and float(branch.keys[0][0, 10, 0]) == -1.0


def test_chunks_sized_by_time_carry_new_prompts_beside_running_streams(settings_for, one_at_a_time):
    """The default (`VL_PREFILL_CHUNK=0`): beside running streams a prompt's chunk is sized from the
    measured decode step and prompt-token times; the running stream still gets a token in every
    pass that carries a chunk, and every answer is the one given alone."""
    from vlservice.engine.service import load_service

    svc = load_service(settings_for(max_batch=4, kv_cache_mb=0, queue_size=16, warmup=False, disk_cache_mb=0))
    try:
        assert svc.scheduler.prefill_chunk == 0
        runner = svc.submit(request(-1, "Hello", max_tokens=60, min_tokens=60))
        answering, out = threading.Event(), {}

        def consume():
            parts = []
            for ev in runner.events():
                if ev.kind == "delta":
                    parts.append(ev.text)
                    answering.set()
            out["text"] = "".join(parts)

        t = threading.Thread(target=consume)
        t.start()
        assert answering.wait(60)
        newcomers = [request(40 + i, max_tokens=5) for i in range(3)]
        gens = [svc.submit(r) for r in newcomers]
        got = [g.result()["text"] for g in gens]
        t.join(60)
        runner_text = out["text"]
        assert got == [one_at_a_time.chat(r)["text"] for r in newcomers]
        assert runner_text == one_at_a_time.chat(request(-1, "Hello", max_tokens=60, min_tokens=60))["text"]
        stats = svc.scheduler.stats()
        assert stats["mixed_steps"] >= 3  # each newcomer's prompt rode along with the runner's tokens
        assert stats["prefill_token_ms"] is not None and stats["prefill_token_ms"] >= 0  # measured
        assert 1 <= stats["last_chunk"] <= 512  # the last pass carried the end of a prompt
    finally:
        svc.close()
