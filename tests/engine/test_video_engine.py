"""Video through the engine on a real tiny Qwen3-VL, against the reference where it runs.

The reference here is transformers' own code: `Qwen3VLProcessor`'s prompt expansion
(`replace_video_token`, `get_text_with_replacements`, `create_mm_token_type_ids`) on the same grid
and frame indices, and `model.generate` with `pixel_values_videos` and `video_grid_thw` (its
`get_rope_index`, its vision tower, its deepstack). The pixel values are ours on both sides: the
reference video processor resizes with torchvision, which does not load beside our torch (the
resize rule and patch layout are compared in tests/unit/test_video.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from vlservice.engine.media import video
from vlservice.engine.media.prepare import chat_prompt
from vlservice.engine.types import ChatRequest, Message, Sampling, VideoInput

from conftest import make_clip

QUESTION = "Describe this video."


def ask(service, *parts, max_tokens=8, history=(), **sampling):
    msgs = list(history) + [Message("user", list(parts))]
    return service.chat(ChatRequest(messages=msgs, sampling=Sampling(max_tokens=max_tokens, **sampling)))


def reference_processor(tokenizer):
    """`Qwen3VLProcessor` with its tokenizer; built without `__init__`, whose processor-class check
    looks the video processor up in a registry that needs torchvision."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    proc = object.__new__(Qwen3VLProcessor)
    proc.tokenizer = tokenizer
    proc.video_processor = Qwen3VLVideoProcessor()
    proc.image_token, proc.video_token = "<|image_pad|>", "<|video_pad|>"
    proc.vision_start_token, proc.vision_end_token = "<|vision_start|>", "<|vision_end|>"
    proc.image_token_id, proc.video_token_id = tokenizer.convert_tokens_to_ids([proc.image_token, proc.video_token])
    return proc


def reference_ids(tokenizer, prepared: video.PreparedVideo, question: str):
    import torch
    from transformers.video_utils import VideoMetadata

    proc = reference_processor(tokenizer)
    inputs = {"video_grid_thw": torch.tensor([prepared.grid_thw]),
              "video_metadata": [VideoMetadata(total_num_frames=None, fps=prepared.video_fps,
                                               frames_indices=list(prepared.frame_indices))]}
    chat = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    expanded, _ = proc.get_text_with_replacements([text], videos_replacements=[proc.replace_video_token(inputs, 0)])
    ids = tokenizer(expanded[0], add_special_tokens=False)["input_ids"]
    return ids, proc.create_mm_token_type_ids([ids])[0]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> bytes:
    return make_clip(tmp_path_factory.mktemp("clips"), "VP80", fps=10.0, frames=25, size=(96, 64))


def test_prompt_expansion_and_rope_index_equal_the_reference(service_for, clip):
    import torch

    svc = service_for("torch")
    prepared = svc.media.video(VideoInput(clip))
    prompt = chat_prompt(svc.tokenizer, [Message("user", [VideoInput(clip), QUESTION])], [prepared])
    ids, mm_types = reference_ids(svc.tokenizer, prepared, QUESTION)
    assert prompt.input_ids == ids
    assert mm_types.count(2) == prepared.num_tokens and mm_types.count(1) == 0
    assert prompt.video_grids == [prepared.grid_thw] and prepared.grid_thw[0] == 3  # 5 frames, padded to 6
    ref_pos, ref_delta = svc.model.model.get_rope_index(torch.tensor([ids]), torch.tensor([mm_types]),
                                                        video_grid_thw=torch.tensor([prepared.grid_thw]))
    pos, delta = svc.inputs.positions(prompt)
    assert torch.equal(pos[1:], ref_pos) and delta == int(ref_delta)
    # the media span covers every temporal patch (and the timestamps between them)
    (start, end), = prompt.media_spans(svc.inputs.image_token_id, svc.inputs.video_token_id)
    assert ids[start] == ids[end - 1] == svc.inputs.video_token_id
    assert sum(1 for t in ids if t == svc.inputs.video_token_id) == prepared.num_tokens


@pytest.mark.parametrize("backend", ["torch", "onnx-fp32"])
def test_greedy_answer_equals_transformers_generate_on_the_video(service_for, tiny_model_dir, clip, backend):
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    svc = service_for(backend)
    ours = ask(svc, VideoInput(clip), QUESTION, max_tokens=10, min_tokens=10)
    prepared = svc.media.video(VideoInput(clip))
    ids, mm_types = reference_ids(svc.tokenizer, prepared, QUESTION)
    model = Qwen3VLForConditionalGeneration.from_pretrained(tiny_model_dir).eval()
    out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         pixel_values_videos=torch.from_numpy(prepared.pixel_values),
                         video_grid_thw=torch.tensor([prepared.grid_thw]), mm_token_type_ids=torch.tensor([mm_types]),
                         max_new_tokens=10, min_new_tokens=10, do_sample=False)
    assert ours["text"] == svc.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    assert ours["usage"]["prompt_tokens"] == len(ids)
    t = ours["timings"]
    assert t["video_tokens"] == prepared.num_tokens and t["video_frames"] == 5 and t["image_tokens"] == 0
    assert t["video_decode_ms"] > 0 and t["video_preprocess_ms"] > 0


def test_onnx_encoders_take_a_video_grid(service_for, clip):
    reference = service_for("torch").encoder
    prepared = service_for("torch").media.video(VideoInput(clip))
    assert prepared.grid_thw[0] > 1
    a = reference(prepared.pixel_values, prepared.grid_thw)
    for backend, tolerance in (("onnx-fp32", 1e-4), ("onnx-int8", None)):
        b = service_for(backend).encoder(prepared.pixel_values, prepared.grid_thw)
        assert b.embeds.shape == a.embeds.shape == (prepared.num_tokens, a.embeds.shape[1])
        assert service_for(backend).feature_shape(prepared).mismatch(b) is None  # what a cached clip is held to
        for x, y in zip([a.embeds, *a.deepstack], [b.embeds, *b.deepstack]):
            if tolerance:
                np.testing.assert_allclose(y, x, atol=tolerance)
            else:
                cos = float((x * y).sum() / np.linalg.norm(x) / np.linalg.norm(y))
                assert cos > 0.99


def test_second_question_about_the_clip_encodes_nothing(service_for, clip):
    svc = service_for("onnx-int8")
    calls = svc.encoder_calls
    first = ask(svc, VideoInput(clip), QUESTION)
    second = ask(svc, VideoInput(clip), "What moves?")
    assert svc.encoder_calls == calls + 1
    assert first["timings"]["vision_cache_hit"] is False and second["timings"]["vision_cache_hit"] is True
    # a follow-up in the same conversation reuses the KV of the video: neither encoded nor looked up
    history = [Message("user", [VideoInput(clip), QUESTION]), Message("assistant", [first["text"]])]
    follow = ask(svc, "And then?", history=history)
    assert svc.encoder_calls == calls + 1
    assert follow["timings"]["cache_n"] > follow["timings"]["video_tokens"]
    # another detail is another budget: another key, another encode
    ask(svc, VideoInput(clip, detail="low"), QUESTION)
    assert svc.encoder_calls == calls + 2
