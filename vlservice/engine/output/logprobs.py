"""Log probabilities in OpenAI's shape: `{token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}` per answer token, the token's text and UTF-8 bytes from the tokenizer's vocabulary (a
byte-level BPE token may be part of a character: its `bytes` are exact, its `token` text then has
U+FFFD for the missing part, as OpenAI's)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (printable stand-ins for the 256 bytes), reversed."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


class TokenText:
    """A token id to (text, UTF-8 bytes), cached per id."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        hit = self.cache.get(token)
        if hit is None:
            piece = self.tok.convert_ids_to_tokens(token)
            decoder = _byte_decoder()
            if isinstance(piece, str) and piece and all(c in decoder for c in piece):
                raw = bytes(decoder[c] for c in piece)
            else:  # a special token, or a vocabulary that is not byte-level
                raw = self.tok.decode([token]).encode("utf-8")
            hit = self.cache[token] = (raw.decode("utf-8", errors="replace"), list(raw))
        return hit

    def entry(self, token: int, logprob: float, top: list[tuple[int, float]]) -> dict:
        text, raw = self(token)
        alternatives = []
        for t, lp in top:
            t_text, t_raw = self(t)
            alternatives.append({"token": t_text, "logprob": lp, "bytes": t_raw})
        return {"token": text, "logprob": logprob, "bytes": raw, "top_logprobs": alternatives}
