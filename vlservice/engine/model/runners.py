"""The language model's runner, chosen once: `load_lm(settings, path)`.

Every `VL_LLM_QUANT` is one class behind `lm.LMRunner`:

- "" (float32, the default): `lm.LeanLM` over the checkpoint's float32 modules (prepacked for MKL);
- "int8": `lm.LeanLM` over PyTorch dynamic INT8 linears (`quant.load_int8_model`), rows independent
  of their batch, q/k/v and gate/up fused;
- "int4": `ortdecode.OrtLM`, the whole language model as one ONNX Runtime graph over 4-bit weights;
  PyTorch holds only the model's frame (the token embedding, mapped; the vision tower until the
  encoder is exported).

Loading happens before Gunicorn forks (the weights' pages shared by the workers); a runner's
thread pools start in `start()`, after the fork. Nothing outside this module asks which runner it
has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .lm import LeanLM, LMRunner


@dataclass
class LoadedLM:
    """A runner, the model object the service reads its configuration, embedding, M-RoPE and
    vision tower from, and what loading measured."""

    runner: LMRunner
    model: Any  # Qwen3VLForConditionalGeneration (with int4: its frame)
    quantize_s: float = 0.0  # int8: building the stored INT8 weights (0 once stored)
    int8_stats: dict = field(default_factory=dict)
    prepack_stats: dict = field(default_factory=dict)
    decoder_stats: dict = field(default_factory=dict)  # int4: the graph's build and size


def load_lm(settings, path: Path, model=None) -> LoadedLM:
    """The language model as `settings.llm_quant` wants it, from the checkpoint at `path` (or
    `model`, an already loaded float model to share, converted in place), in eval mode."""
    import torch

    from .vision import onnx_ready

    need_vision = not onnx_ready(path, settings.cache_path, settings.vision_backend)
    if settings.llm_quant == "int4":  # the graph is built before any weights load: its peak memory is its own
        from .ortdecode import OrtLM, ensure_decoder
        from .quant import load_embedding_model

        graph, built = ensure_decoder(path, settings.cache_path)
        frame = model if model is not None else load_embedding_model(path, need_vision)
        text = frame.model.language_model
        return LoadedLM(OrtLM(graph, text.embed_tokens, text.config, settings.num_threads),
                        _eval(frame), decoder_stats=built)
    if settings.llm_quant == "int8":
        from .quant import load_int8_model, quantize_llm_int8
        from .linears import fuse_int8_projections, make_rows_independent

        int8: dict = {}
        if model is None:
            model, int8 = load_int8_model(path, settings.cache_path, need_vision)
            quantize_s = int8["build_s"]
        else:  # a shared float model (the benchmark): quantised in place
            quantize_s = quantize_llm_int8(model)
        make_rows_independent(model)  # a request's answer must not depend on who shares its batch
        fuse_int8_projections(model)  # q/k/v and gate/up as one product each (the same bits)
        model = _eval(model)
        return LoadedLM(LeanLM(model), model, quantize_s=quantize_s, int8_stats=int8)
    prepack: dict = {}
    if model is None:
        from transformers import Qwen3VLForConditionalGeneration

        model = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
        if settings.llm_prepack:
            from .linears import prepack_llm

            prepack = prepack_llm(model, path)
    model = _eval(model)
    return LoadedLM(LeanLM(model), model, prepack_stats=prepack)


def _eval(model):
    model = model.eval()
    model.requires_grad_(False)
    return model
