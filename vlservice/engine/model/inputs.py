"""A prompt as the language model's inputs: embeddings with the vision features in place, M-RoPE
positions, and the image tokens' mask and deepstack features.

We drive `Qwen3VLForConditionalGeneration`'s own modules (embedding, `get_rope_index` for M-RoPE)
instead of `model.generate`, because a server needs what `generate` hides: features that come from
our cache or ONNX Runtime instead of `model.visual`, and the KV cache in our hands. The forward
passes are `lm.LeanLM`'s (or `ortdecode.OrtLM`'s); the scheduler (`scheduler.py`) runs the token
loop over them.
"""

from __future__ import annotations

import torch

from ..prompt import Prompt
from .vision import VisionFeatures


class ModelInputs:
    """The model's special tokens and what the forward passes need to prefill a prompt."""

    def __init__(self, model, eos_ids):
        self.model = model
        self.embed = model.model.get_input_embeddings()
        self.image_token_id = model.config.image_token_id
        self.video_token_id = model.config.video_token_id
        self.eos_ids = set(int(e) for e in eos_ids)

    def positions(self, prompt: Prompt) -> tuple[torch.Tensor, int]:
        """(4, 1, L) position ids (text row + 3 M-RoPE rows) and the rope delta for decoding."""
        ids = torch.tensor([prompt.input_ids], dtype=torch.long)
        text_pos = torch.arange(ids.shape[1]).view(1, 1, -1)
        if not prompt.image_grids and not prompt.video_grids:
            return text_pos.expand(4, 1, -1), 0
        # the processor's mm_token_type_ids: 1 image, 2 video (each temporal patch is its own grid there)
        mm_types = (ids == self.image_token_id).int() + 2 * (ids == self.video_token_id).int()

        def grids(g):
            return torch.tensor([list(x) for x in g], dtype=torch.long) if g else None

        mrope, delta = self.model.model.get_rope_index(ids, mm_token_type_ids=mm_types,
                                                       image_grid_thw=grids(prompt.image_grids),
                                                       video_grid_thw=grids(prompt.video_grids))
        return torch.cat([text_pos, mrope], dim=0), int(delta.view(-1)[0])

    def prefill_inputs(self, prompt: Prompt, features: list[VisionFeatures], start: int = 0):
        """What the lean forward (`lm.LeanLM`) needs to prefill `prompt` from token `start`:
        ((embeds (1, L, hidden) with the image features in place, M-RoPE positions (3, 1, L),
        the image tokens' mask (1, L) or None, their deepstack features or None), SeqPos).
        `features` are those of the images after `start`, in order."""
        from .lm import SeqPos

        all_pos, delta = self.positions(prompt)
        with torch.inference_mode():
            ids = torch.tensor([prompt.input_ids[start:]], dtype=torch.long)
            embeds = self.embed(ids)
            mask = deepstack = None
            if features:
                # image and video tokens alike, in prompt order (as the model's forward joins them)
                mask = (ids == self.image_token_id) | (ids == self.video_token_id)
                image_embeds = torch.from_numpy(_cat([f.embeds for f in features])).to(embeds.dtype)
                if int(mask.sum()) != image_embeds.shape[0]:
                    raise ValueError("image tokens and image features do not match")
                embeds = embeds.masked_scatter(mask.unsqueeze(-1), image_embeds)
                deepstack = [torch.from_numpy(_cat([f.deepstack[i] for f in features])).to(embeds.dtype)
                             for i in range(len(features[0].deepstack))]
        return (embeds, all_pos[1:, :, start:], mask, deepstack), SeqPos(next_pos=len(prompt), delta=delta)


def _cat(arrays):
    import numpy as np

    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
