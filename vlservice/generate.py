"""The LLM side: chat template to tokens, vision features into the embeddings, token loop.

We drive `Qwen3VLForConditionalGeneration`'s own modules (embedding, language model with its
deepstack inputs, lm_head, `get_rope_index` for M-RoPE) instead of `model.generate`, because a
server needs what `generate` hides: features that come from our cache or ONNX Runtime instead of
`model.visual`, a token loop that can be cancelled between tokens, text that streams only in whole
UTF-8 characters, stop strings, and the KV cache in our hands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .vision import VisionFeatures


@dataclass
class Sampling:
    max_tokens: int = 256
    min_tokens: int = 0
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Prompt:
    input_ids: list
    image_grids: list = field(default_factory=list)  # (1, h, w) per image, in order

    def __len__(self) -> int:
        return len(self.input_ids)

    def image_spans(self, image_token_id: int) -> list[tuple[int, int]]:
        """(start, end) of each image's run of placeholder tokens, in order."""
        spans, start = [], None
        for i, t in enumerate(self.input_ids):
            if t == image_token_id and start is None:
                start = i
            elif t != image_token_id and start is not None:
                spans.append((start, i))
                start = None
        if start is not None:
            spans.append((start, len(self.input_ids)))
        return spans


def render_chat(tokenizer, messages: list[dict]) -> str:
    """The chat template's text, with one `<|image_pad|>` per image (as the processor expects)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def build_prompt(tokenizer, messages: list[dict], image_tokens: list[int], image_grids: list) -> Prompt:
    """Expand each image placeholder to its number of tokens, then tokenize."""
    text = render_chat(tokenizer, messages)
    pad = "<|image_pad|>"
    pieces = text.split(pad)
    if len(pieces) - 1 != len(image_tokens):
        raise ValueError(f"the chat template produced {len(pieces) - 1} image slots for {len(image_tokens)} images")
    out = [pieces[0]]
    for n, rest in zip(image_tokens, pieces[1:]):
        out.append(pad * n)
        out.append(rest)
    ids = tokenizer("".join(out), add_special_tokens=False)["input_ids"]
    return Prompt(input_ids=ids, image_grids=list(image_grids))


class Decoder:
    """Model-level operations on one sequence: prefill with image features, then one token at a time."""

    def __init__(self, model, eos_ids):
        self.model = model
        self.config = model.config
        self.lm = model.model.language_model
        self.embed = model.model.get_input_embeddings()
        self.lm_head = model.lm_head
        self.image_token_id = model.config.image_token_id
        self.eos_ids = set(int(e) for e in eos_ids)

    # ----------------------------------------------------------------- positions
    def positions(self, prompt: Prompt) -> tuple[torch.Tensor, int]:
        """(4, 1, L) position ids (text row + 3 M-RoPE rows) and the rope delta for decoding."""
        ids = torch.tensor([prompt.input_ids], dtype=torch.long)
        text_pos = torch.arange(ids.shape[1]).view(1, 1, -1)
        if not prompt.image_grids:
            return text_pos.expand(4, 1, -1), 0
        mm_types = (ids == self.image_token_id).int()
        grids = torch.tensor([list(g) for g in prompt.image_grids], dtype=torch.long)
        mrope, delta = self.model.model.get_rope_index(ids, mm_token_type_ids=mm_types, image_grid_thw=grids)
        return torch.cat([text_pos, mrope], dim=0), int(delta.view(-1)[0])

    # ----------------------------------------------------------------- forward passes
    @torch.inference_mode()
    def prefill(self, prompt: Prompt, features: list[VisionFeatures], cache, start: int = 0):
        """Run the prompt from token `start` (the cache holds the ones before); returns the logits
        of the next token. `features` are those of the images after `start`, in order."""
        all_pos, delta = self.positions(prompt)
        ids = torch.tensor([prompt.input_ids[start:]], dtype=torch.long)
        pos = all_pos[:, :, start:]
        embeds = self.embed(ids)
        kwargs = {}
        if features:
            mask = ids == self.image_token_id
            image_embeds = torch.from_numpy(_cat([f.embeds for f in features])).to(embeds.dtype)
            if int(mask.sum()) != image_embeds.shape[0]:
                raise ValueError("image tokens and image features do not match")
            embeds = embeds.masked_scatter(mask.unsqueeze(-1), image_embeds)
            layers = len(features[0].deepstack)
            kwargs = {
                "visual_pos_masks": mask,
                "deepstack_visual_embeds": [
                    torch.from_numpy(_cat([f.deepstack[i] for f in features])).to(embeds.dtype)
                    for i in range(layers)
                ],
            }
        out = self.lm(inputs_embeds=embeds, position_ids=pos, cache=cache, use_cache=True, **kwargs)
        self._delta = delta
        self._next_pos = len(prompt)
        return self.lm_head(out.last_hidden_state[:, -1]).float()[0]

    def resume(self, prompt: Prompt) -> None:
        """Continue after `prompt` whose KV is already cached (no forward pass)."""
        _, self._delta = self.positions(prompt)
        self._next_pos = len(prompt)

    @torch.inference_mode()
    def step(self, token: int, cache):
        embeds = self.embed(torch.tensor([[token]], dtype=torch.long))
        p = self._next_pos
        pos = torch.tensor([p, p + self._delta, p + self._delta, p + self._delta], dtype=torch.long).view(4, 1, 1)
        out = self.lm(inputs_embeds=embeds, position_ids=pos, cache=cache, use_cache=True)
        self._next_pos += 1
        return self.lm_head(out.last_hidden_state[:, -1]).float()[0]

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.config.text_config)


def _cat(arrays):
    import numpy as np

    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)


# --------------------------------------------------------------------------- sampling

class Sampler:
    def __init__(self, sampling: Sampling):
        self.s = sampling
        self.gen = None
        if not sampling.greedy:
            self.gen = torch.Generator()
            self.gen.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())

    def __call__(self, logits: torch.Tensor, seen: list[int], forbid: set | None = None) -> int:
        s = self.s
        if s.repetition_penalty != 1.0 and seen:
            idx = torch.tensor(sorted(set(seen)), dtype=torch.long)
            vals = logits[idx]
            logits = logits.clone()
            logits[idx] = torch.where(vals > 0, vals / s.repetition_penalty, vals * s.repetition_penalty)
        if forbid:
            logits = logits.clone()
            logits[list(forbid)] = -math.inf
        if s.greedy:
            return int(torch.argmax(logits))
        logits = logits / s.temperature
        if s.top_k and s.top_k > 0:
            kth = torch.topk(logits, min(s.top_k, logits.shape[-1])).values[-1]
            logits = torch.where(logits < kth, torch.full_like(logits, -math.inf), logits)
        probs = torch.softmax(logits, dim=-1)
        if s.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_probs, dim=-1)
            drop = cum - sorted_probs > s.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
            probs = probs / probs.sum()
        return int(torch.multinomial(probs, 1, generator=self.gen))


# --------------------------------------------------------------------------- streaming text

class TextStream:
    """Token ids in, text deltas out: whole UTF-8 characters only, stop strings held back and cut."""

    def __init__(self, tokenizer, stop: tuple = ()):
        self.tok = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.emitted = 0  # characters of the decoded text already sent
        self.stopped = False

    def text(self) -> str:
        return self.tok.decode(self.ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.text()
        if text.endswith("\ufffd"):  # half a character: wait for the rest
            return ""
        for s in self.stop:
            at = text.find(s, max(0, self.emitted - len(s)))
            if at != -1:
                self.stopped = True
                delta = text[self.emitted:at]
                self.emitted = at
                return delta
        safe = len(text)
        for s in self.stop:  # hold back a tail that could be the start of a stop string
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    safe = min(safe, len(text) - k)
                    break
        delta = text[self.emitted:safe]
        self.emitted = max(self.emitted, safe)
        return delta

    def text_sent(self) -> str:
        """Everything emitted so far (after `flush`: the whole answer as the client saw it)."""
        return self.text()[:self.emitted]

    def flush(self) -> str:
        if self.stopped:
            return ""
        text = self.text().rstrip("\ufffd")
        delta = text[self.emitted:]
        self.emitted = len(text)
        return delta
