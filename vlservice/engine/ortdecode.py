"""Decode steps in ONNX Runtime over 4-bit weights (`VL_LLM_QUANT=int4`).

A decode step on a CPU streams every weight once per token, so its time is the weights' bytes
over the memory bandwidth plus what runs around the products. 4-bit weights halve the first term
against INT8; a runtime that owns the whole decoder graph removes most of the second (eager
PyTorch dispatches ~2,500 small operators per step from Python).

So, with `int4`, a token is one ONNX Runtime call on a graph that ONNX Runtime GenAI's model
builder writes from the checkpoint (its `Qwen3VLTextModel`: `MatMulNBits` 4-bit products, a scale
per block of 128 weights, with int8 activations (`accuracy_level` 4, VNNI where the CPU has it), `GroupQueryAttention`, the
interleaved M-RoPE). The prompt still runs through the PyTorch INT8 LLM (`LeanLM`), since only it
adds the images' deepstack features; the decoder then reads the KV cache that prefill wrote.
No vision input is needed past the prompt: a decode position is the text position plus the
sequence's M-RoPE offset, the same on all three axes.

The KV cache is shared, never copied per step: the graph's past and present tensors are bound to
the same buffer (GroupQueryAttention's shared-buffer mode writes the new position in place). At
batch 1 that buffer is the sequence's own `SeqKV`; for a batch, the sequences' caches move into
one (batch, heads, capacity, dim) arena per layer when the batch's membership changes, and their
`SeqKV`s keep writing there through views until they leave (`release` copies a leaving cache out).
Each row's products quantize their activations per row and block, so a sequence's answer does not
depend on its batch mates.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock

from .kv import SeqKV
from .lm import Chunk, LeanLM, SeqPos

log = logging.getLogger(__name__)

EXPORT_VERSION = 3  # 2: blocks of 128 where the widths allow; 3: and rows are >= 1024 wide
PRECISIONS = ("int4", "fp32")  # int4: served; fp32: the same graph unquantised (the tests' exact check)


def ensure_decoder(model_dir: Path, cache_dir: Path, precision: str = "int4") -> tuple[Path, dict]:
    """The decoder graph for `model_dir`, written once by the model builder and reused (workers and
    `export` never write one folder at once). Returns (model.onnx path, stats)."""
    from .vision import fingerprint

    key = fingerprint(model_dir, extra=f"llm-{precision}-{EXPORT_VERSION}")
    folder = cache_dir / "llm-onnx" / key[:24] / precision
    stats = {"fingerprint": key, "export_s": 0.0}
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / ".lock")):
        if not (folder / "model.onnx").is_file():
            stats["export_s"] = build_decoder(model_dir, folder, precision)
    stats["file_bytes"] = sum(p.stat().st_size for p in folder.glob("model.onnx*"))
    return folder / "model.onnx", stats


def build_decoder(model_dir: Path, folder: Path, precision: str) -> float:
    """Run ONNX Runtime GenAI's model builder on the checkpoint (text decoder only, embeddings left
    out: we feed the embedded tokens). Written to a temporary folder, then moved into place."""
    if precision not in PRECISIONS:
        raise ValueError(f"decoder precision must be one of {PRECISIONS}, got {precision!r}")
    t0 = time.perf_counter()
    log.info("building the %s ONNX decoder of %s in %s (once; ONNX Runtime GenAI's model builder)",
             precision, model_dir, folder)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=folder.parent))
    try:
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o", str(tmp / "out"),
               "-p", precision, "-e", "cpu", "-c", str(tmp / "cache"), "--extra_options", "exclude_embeds=true"]
        if precision == "int4":  # int8 activations (VNNI where there is), one scale per block of weights
            cmd += ["accuracy_level=4", f"block_size={block_size(model_dir)}"]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0 or not (tmp / "out" / "model.onnx").is_file():
            tail = (done.stderr or done.stdout)[-2000:]
            raise RuntimeError(f"the ONNX decoder build failed (exit {done.returncode}):\n{tail}")
        shutil.rmtree(tmp / "cache", ignore_errors=True)
        (tmp / "out" / "build.json").write_text(json.dumps({"precision": precision, "command": cmd[1:],
                                                           "seconds": time.perf_counter() - t0}))
        if folder.exists():
            shutil.rmtree(folder)
        (tmp / "out").rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return time.perf_counter() - t0


def block_size(model_dir: Path) -> int:
    """4-bit weights' block (one scale each): 128 where every product's input width divides by it
    and is at least 1024 wide, so a block stays a small slice of a row (the real model: 4.25 bits a
    weight, and measured 1.26x / 1.4x faster steps at batch 1 / 4 than blocks of 32 on an AMD EPYC
    with VNNI); else 32. On the demo model (rows of 128) blocks of 128 cost 1.6-2.0 points of
    reading accuracy where blocks of 32 lost none (docs/bench/demo-eval-int4*.json)."""
    text = json.loads((model_dir / "config.json").read_text()).get("text_config", {})
    widths = (text.get("hidden_size", 0), text.get("intermediate_size", 0),
              text.get("num_attention_heads", 0) * text.get("head_dim", 0))
    return 128 if all(w >= 1024 and w % 128 == 0 for w in widths) else 32


class OrtDecoder:
    """One decode step for B sequences as one ONNX Runtime call over their KV caches."""

    def __init__(self, path: Path, embed: torch.nn.Module, threads: int, profile: bool = False):
        """`profile`: ONNX Runtime times every node (`bench --decode` reads the products' share)."""
        import onnxruntime as ort

        self.ort = ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.enable_profiling = profile
        # Idle pool threads sleep instead of spinning: the prompt's PyTorch passes and the encoder run
        # between decode calls and need the cores (spinning measured 128 vs 71 ms a step with one
        # other busy process on 2 cores).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.embed = embed
        self.layers = sum(1 for i in self.session.get_inputs() if i.name.endswith(".key"))
        self.vocab = self.session.get_outputs()[0].shape[-1]
        self._arena: tuple | None = None  # (the batch's SeqKVs, per-layer key buffers, value buffers)

    @torch.inference_mode()
    def decode(self, tokens: list[int], kvs: list[SeqKV], pos: list[SeqPos]) -> torch.Tensor:
        """One token for each sequence; returns float32 logits (B, vocab). Advances caches and
        positions, like `LeanLM.decode`."""
        b = len(tokens)
        for kv in kvs:
            kv.reserve(kv.length + 1)
        keys, values = self._buffers(kvs)
        total = max(kv.length for kv in kvs) + 1
        mask = np.zeros((b, total), dtype=np.int64)
        for row, kv in enumerate(kvs):
            mask[row, :kv.length + 1] = 1
        positions = np.array([p.next_pos + p.delta for p in pos], dtype=np.int64).reshape(1, b, 1).repeat(3, axis=0)
        embeds = self.embed(torch.tensor(tokens, dtype=torch.long).view(b, 1)).float().contiguous()
        logits = np.empty((b, 1, self.vocab), dtype=np.float32)
        io = self.session.io_binding()
        io.bind_cpu_input("inputs_embeds", embeds.numpy())
        io.bind_cpu_input("attention_mask", mask)
        io.bind_cpu_input("position_ids", positions)
        io.bind_ortvalue_output("logits", self.ort.OrtValue.ortvalue_from_numpy(logits))
        for i in range(self.layers):  # past and present share one buffer: the new position is written in place
            for name, out, buf in ((f"past_key_values.{i}.key", f"present.{i}.key", keys[i]),
                                   (f"past_key_values.{i}.value", f"present.{i}.value", values[i])):
                value = self.ort.OrtValue.ortvalue_from_numpy(buf.numpy())
                io.bind_ortvalue_input(name, value)
                io.bind_ortvalue_output(out, value)
        self.session.run_with_iobinding(io)
        for kv, p in zip(kvs, pos):
            kv.advance(1)
            p.next_pos += 1
        return torch.from_numpy(logits.reshape(b, self.vocab))

    def _buffers(self, kvs: list[SeqKV]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per layer, the (B, heads, capacity, dim) key and value buffers of this batch."""
        if len(kvs) == 1:
            kv = kvs[0]
            return [k.unsqueeze(0) for k in kv.keys], [v.unsqueeze(0) for v in kv.values]
        if self._arena is None or not self._arena_holds(kvs):
            self._build_arena(kvs)
        assert self._arena is not None
        b = len(kvs)  # the arena's first rows: a batch whose last members left goes on in place
        return [k[:b] for k in self._arena[1]], [v[:b] for v in self._arena[2]]

    def _arena_holds(self, kvs: list[SeqKV]) -> bool:
        """Every cache of this batch still writes into the arena, in the arena's first rows, in order."""
        members, keys, _ = self._arena  # type: ignore[misc]
        return (len(kvs) <= keys[0].shape[0] and all(any(kv is m for m in members) for kv in kvs)
                and all(kv.keys[0].data_ptr() == keys[0][row].data_ptr() for row, kv in enumerate(kvs)))

    def _build_arena(self, kvs: list[SeqKV]) -> None:
        """Move the batch's caches into one buffer per layer; each `SeqKV` then views its row. Members
        of the old arena outside this batch get storage of their own; the others move once, here."""
        if self._arena is not None:
            for kv in self._arena[0]:
                if not any(kv is k for k in kvs):
                    _own(kv)
            self._arena = None
        cap = max(kv.capacity for kv in kvs)
        first = kvs[0]
        shape = (len(kvs), first.kv_heads, cap, first.head_dim)
        keys = [torch.empty(shape, dtype=first.dtype) for _ in range(first.layers)]
        values = [torch.empty(shape, dtype=first.dtype) for _ in range(first.layers)]
        for row, kv in enumerate(kvs):
            for store, arena in ((kv.keys, keys), (kv.values, values)):
                for i in range(kv.layers):
                    arena[i][row, :, :kv.length].copy_(store[i][:, :kv.length])
                    store[i] = arena[i][row]
            kv.capacity = cap
        self._arena = (list(kvs), keys, values)

    def release(self, kv: SeqKV) -> None:
        """`kv` leaves the batch: if it lives in the arena, give it storage of its own (the arena's
        row would otherwise stay alive, and be written, as long as the cache is kept)."""
        if self._arena is not None and any(kv is m for m in self._arena[0]):
            _own(kv)
            self._arena[0][:] = [m for m in self._arena[0] if m is not kv]

    def release_all(self) -> None:
        if self._arena is not None:
            for kv in self._arena[0]:
                _own(kv)
            self._arena = None


def _own(kv: SeqKV) -> None:
    """Copy `kv`'s filled part into buffers of its own, of the same capacity."""
    for store in (kv.keys, kv.values):
        for i, t in enumerate(store):
            own = torch.empty_like(t)
            own[:, :kv.length].copy_(t[:, :kv.length])
            store[i] = own


class SplitLM:
    """`LeanLM`'s interface with decode steps in ONNX Runtime: prompts (and their images'
    deepstack features) go through the PyTorch `LeanLM`, each token through `OrtDecoder`."""

    def __init__(self, lean: LeanLM, decoder: OrtDecoder):
        self.lean, self.decoder = lean, decoder

    def __getattr__(self, name):  # layers, embed, lm_head, new_kv, ...: the PyTorch model's
        return getattr(self.lean, name)

    def decode(self, tokens: list[int], kvs: list[SeqKV], pos: list[SeqPos]) -> torch.Tensor:
        return self.decoder.decode(tokens, kvs, pos)

    def prefill(self, kv: SeqKV, embeds: torch.Tensor, positions: torch.Tensor, visual_mask=None,
                deepstack=None, logits: bool = True):
        return self.lean.prefill(kv, embeds, positions, visual_mask, deepstack, logits)

    def step(self, tokens: list[int], kvs: list[SeqKV], pos: list[SeqPos], chunk: Chunk | None = None):
        """The running tokens in ONNX Runtime, then the prompt's chunk in PyTorch (two passes: the
        two runtimes hold different weights)."""
        logits = self.decoder.decode(tokens, kvs, pos) if tokens else None
        last = self.lean.step([], [], [], chunk)[1] if chunk is not None else None
        return logits, last

    def release(self, kv: SeqKV) -> None:
        self.decoder.release(kv)
