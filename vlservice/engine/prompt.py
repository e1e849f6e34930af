"""The chat template to tokens: one placeholder per image expanded to its number of tokens."""

from __future__ import annotations

from dataclasses import dataclass, field


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
