"""Small real checkpoints we build ourselves, for the tests and the benchmark.

`make_model()` writes a checkpoint of the real Qwen3-VL architecture (the real transformers
classes, deepstack layers kept) with a real Qwen tokenizer, chat template and preprocessor file,
at any size: tiny for tests, the exact real size for the benchmark. Deterministic from a seed.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

# Sizes for `make_model`: only what differs from the real architecture.
TINY = {
    "init": 0.25,  # a larger initializer_range so a random tiny model's answer depends on its input
    "text": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16,
                 rope_scaling={"mrope_interleaved": True, "mrope_section": [2, 3, 3], "rope_type": "default"}),
    "vision": dict(depth=3, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=64,
                   deepstack_visual_indexes=[0, 1, 2], num_position_embeddings=256),
}
REAL = {"text": {}, "vision": {}}


def real_architecture() -> dict:
    text = resources.files("vlservice").joinpath("assets/qwen3-vl-2b-instruct.config.json").read_text()
    return json.loads(text)


def preprocessor_config(arch: dict) -> dict:
    pre = dict(arch["_preprocessor"])
    return pre


def make_config(sizes: dict = TINY, vocab_size: int | None = None, token_ids: dict | None = None):
    """A `Qwen3VLConfig` of the real architecture with `sizes` applied."""
    from transformers import Qwen3VLConfig

    arch = copy.deepcopy(real_architecture())
    arch.pop("_preprocessor")
    arch["text_config"].update(sizes.get("text", {}))
    arch["vision_config"].update(sizes.get("vision", {}))
    if vocab_size is not None:
        arch["text_config"]["vocab_size"] = vocab_size
    if "init" in sizes:
        arch["text_config"]["initializer_range"] = sizes["init"]
        arch["vision_config"]["initializer_range"] = sizes["init"]
    if token_ids:
        arch.update({k: v for k, v in token_ids.items() if k.endswith("_token_id") and k != "eos_token_id"})
        arch["text_config"]["eos_token_id"] = token_ids["eos_token_id"]
        arch["text_config"]["bos_token_id"] = token_ids["bos_token_id"]
    return Qwen3VLConfig(**arch)


def make_model(directory: str | Path, sizes: dict = TINY, seed: int = 0, vocab_limit: int | None = None,
               model=None, keep_texts=(), preprocessor: dict | None = None):
    """Write a checkpoint of the real architecture (random weights unless `model` is given)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from .tokenizer import save_tokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = save_tokenizer(directory, vocab_limit=vocab_limit, keep_texts=keep_texts)
    ids = token_ids(tok)
    vocab_size = None if vocab_limit is None else _round_up(len(tok), 64)
    config = make_config(sizes, vocab_size=vocab_size, token_ids=ids)
    if model is None:
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = [ids["eos_token_id"], ids["pad_token_id"]]
    model.generation_config.pad_token_id = ids["pad_token_id"]
    model.save_pretrained(str(directory))
    pre = preprocessor_config(real_architecture())
    if preprocessor:
        pre.update(preprocessor)
    (directory / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": tok.chat_template}, indent=2))
    return directory


def token_ids(tok) -> dict:
    def tid(t):
        return tok.convert_tokens_to_ids(t)

    return {
        "image_token_id": tid("<|image_pad|>"),
        "video_token_id": tid("<|video_pad|>"),
        "vision_start_token_id": tid("<|vision_start|>"),
        "vision_end_token_id": tid("<|vision_end|>"),
        "eos_token_id": tid("<|im_end|>"),
        "bos_token_id": tid("<|endoftext|>"),
        "pad_token_id": tid("<|endoftext|>"),
    }


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k
