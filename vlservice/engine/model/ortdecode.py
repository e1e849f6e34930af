"""The language model in ONNX Runtime over 4-bit weights (`VL_LLM_QUANT=int4`): prompts and answers.

A decode step on a CPU streams every weight once per token, so its time is the weights' bytes
over the memory bandwidth plus what runs around the products. 4-bit weights halve the first term
against INT8; a runtime that owns the whole decoder graph removes most of the second (eager
PyTorch dispatches ~2,500 small operators per step from Python).

So, with `int4`, the language model is one graph that ONNX Runtime GenAI's model builder writes from
the checkpoint (its `Qwen3VLTextModel`: `MatMulNBits` 4-bit products, a scale per block of 128
weights, with int8 activations (`accuracy_level` 4, VNNI where the CPU has it),
`GroupQueryAttention`, the interleaved M-RoPE), and nothing else holds its weights: no PyTorch LLM is
loaded, only the checkpoint's token embedding, mapped in its own dtype (`quant.load_embedding_model`).
We adapt the builder's graph once (`adapt_graph`) so that it serves prompts too:

- the images' deepstack features enter as inputs `deepstack_embeds.{i}` (batch, tokens, hidden),
  added to the hidden states after layer i, as `Qwen3VLTextModel` adds them at the image positions
  (zeros elsewhere, and for answer tokens);
- the LM head runs on each row's last position only (a prompt chunk of 512 tokens would otherwise
  multiply 512 rows by the 151,936-word head to keep one).

A prompt chunk runs as its own call of the graph (batch 1, the chunk's length, over the sequence's
cache), and the running answers' tokens as one batched call: `GroupQueryAttention` takes one new
length for all rows, so a chunk cannot share the running tokens' call without padding every row to
the chunk's length.

The KV cache is shared, never copied per step: the graph's past and present tensors are bound to
the same buffer (GroupQueryAttention's shared-buffer mode writes the new positions in place). At
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
from .lm import Chunk, SeqPos

log = logging.getLogger(__name__)

EXPORT_VERSION = 4  # 2: blocks of 128 where the widths allow; 3: and rows are >= 1024 wide;
# 4: deepstack inputs and the last position's logits only (`adapt_graph`)
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
        adapt_graph(tmp / "out" / "model.onnx", deepstack_layers(model_dir))
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


def deepstack_layers(model_dir: Path) -> int:
    """How many layers get the images' deepstack features added after them."""
    cfg = json.loads((model_dir / "config.json").read_text())
    levels = len(cfg.get("vision_config", {}).get("deepstack_visual_indexes", []))
    return min(levels, cfg.get("text_config", {}).get("num_hidden_layers", levels))


def adapt_graph(path: Path, deepstack: int) -> None:
    """Rewrite the builder's graph in place (its weights, in the external data file, untouched) so it
    serves prompts: inputs `deepstack_embeds.{i}` added to layer i's output (its MLP's output, before
    the next layer's fused residual and norm), and the LM head on each row's last position only."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    embeds = next(i for i in graph.input if i.name == "inputs_embeds")
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    added = []
    for i in range(deepstack):
        down = f"/model/layers.{i}/mlp/down_proj/"
        out = next((n.output[0] for n in graph.node if n.name.startswith(down)), None)
        if out is None:
            raise RuntimeError(f"{path}: no {down} product in the builder's graph")
        name, summed = f"deepstack_embeds.{i}", f"/model/layers.{i}/deepstack/Add/output_0"
        inp = onnx.ValueInfoProto()
        inp.CopyFrom(embeds)
        inp.name = name
        graph.input.append(inp)
        for node in consumers.get(out, []):
            node.input[:] = [summed if x == out else x for x in node.input]
        added.append(helper.make_node("Add", [out, name], [summed], name=f"/model/layers.{i}/deepstack/Add"))
    head = next(n for n in graph.node if n.name.startswith("/lm_head/"))
    normed, last = head.input[0], "/lm_head/last_position/output_0"
    head.input[0] = last
    starts, ends, axes = "/lm_head/last_position/starts", "/lm_head/last_position/ends", "/lm_head/last_position/axes"
    for name, value in ((starts, -1), (ends, 2**62), (axes, 1)):
        graph.initializer.append(helper.make_tensor(name, TensorProto.INT64, [1], [value]))
    added.append(helper.make_node("Slice", [normed, starts, ends, axes], [last], name="/lm_head/last_position"))
    nodes = list(graph.node) + added
    del graph.node[:]
    graph.node.extend(_topological(nodes))
    logits = next(o for o in graph.output if o.name == "logits")
    logits.type.tensor_type.shape.dim[1].dim_param = ""
    logits.type.tensor_type.shape.dim[1].dim_value = 1
    onnx.save(model, str(path))


def _topological(nodes: list) -> list:
    """`nodes` ordered so that each comes after the producers of its inputs (ONNX requires it)."""
    made = {name for n in nodes for name in n.output}
    ready: set[str] = set()
    out, waiting = [], list(nodes)
    while waiting:
        rest = []
        for node in waiting:
            if all(not x or x not in made or x in ready for x in node.input):
                out.append(node)
                ready.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(waiting):
            raise RuntimeError("the adapted graph has a cycle")
        waiting = rest
    return out


class OrtLM:
    """The language model as one ONNX Runtime graph: prompt chunks and decode steps (`LeanLM`'s
    interface: `new_kv`, `prefill`, `decode`, `step`, `release`, `embed`)."""

    def __init__(self, path: Path, embed: torch.nn.Module, text_config, threads: int, profile: bool = False):
        """`embed`: the token embedding (the graph takes embedded tokens); `profile`: ONNX Runtime
        times every node (`bench --decode` reads the products' share)."""
        import onnx
        import onnxruntime as ort

        self.ort, self.path, self.threads, self.profile = ort, path, threads, profile
        self._session = None  # opened by start() or the first pass: after the fork
        self.embed = embed
        graph = onnx.load(str(path), load_external_data=False).graph
        names = [i.name for i in graph.input]
        self.layers = sum(1 for n in names if n.endswith(".key"))
        self.deepstack = sum(1 for n in names if n.startswith("deepstack_embeds."))
        self.vocab = next(o for o in graph.output if o.name == "logits").type.tensor_type.shape.dim[-1].dim_value
        del graph
        self.text_config = text_config
        self.hidden = int(text_config.hidden_size)
        self.kv_heads = int(text_config.num_key_value_heads)
        self.head_dim = int(getattr(text_config, "head_dim", None) or self.hidden // text_config.num_attention_heads)
        self._zeros = torch.zeros(0)  # deepstack input of rows that have no image (grown as needed)
        self._arena: tuple | None = None  # (the batch's SeqKVs, per-layer key buffers, value buffers)

    @property
    def session(self):
        """The ONNX Runtime session, opened on first use (in the worker: its thread pool does not
        survive a fork)."""
        if self._session is None:
            ort = self.ort
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
            opts.enable_profiling = self.profile
            # Idle pool threads sleep instead of spinning: the encoder and the HTTP threads run between
            # calls and need the cores (spinning measured 128 vs 71 ms a step with one other busy
            # process on 2 cores).
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            # No arena: ONNX Runtime's CPU arena keeps the largest intermediates it ever made (a long
            # document's prompt chunk) for the process's life; without it, a prompt of 1,500 positions
            # left the process ~190 MB smaller at the same speed (measured on the real-size graph).
            opts.enable_cpu_mem_arena = False
            self._session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        return self._session

    def start(self) -> None:
        self.session  # noqa: B018 (opened now rather than at the first request)

    def new_kv(self, capacity: int = 0) -> SeqKV:
        return SeqKV(self.layers, self.kv_heads, self.head_dim, torch.float32, capacity)

    # ----------------------------------------------------------------- passes
    @torch.inference_mode()
    def decode(self, tokens: list[int], kvs: list[SeqKV], pos: list[SeqPos]) -> torch.Tensor:
        """One token for each sequence; returns float32 logits (B, vocab). Advances caches and
        positions."""
        b = len(tokens)
        for kv in kvs:
            kv.reserve(kv.length + 1)
        keys, values = self._buffers(kvs)
        total = max(kv.length for kv in kvs) + 1
        mask = np.zeros((b, total), dtype=np.int64)
        for row, kv in enumerate(kvs):
            mask[row, :kv.length + 1] = 1
        positions = np.array([p.next_pos + p.delta for p in pos], dtype=np.int64).reshape(1, b, 1).repeat(3, axis=0)
        embeds = self.embed(torch.tensor(tokens, dtype=torch.long).view(b, 1)).float()
        logits = self._run(embeds, mask, positions, keys, values, None, b)
        for kv, p in zip(kvs, pos):
            kv.advance(1)
            p.next_pos += 1
        return logits

    @torch.inference_mode()
    def prefill(self, kv: SeqKV, embeds: torch.Tensor, positions: torch.Tensor, visual_mask=None,
                deepstack=None, logits: bool = True):
        """A chunk of one sequence's prompt over its cache (see `lm.Chunk`); returns the next token's
        float32 logits (vocab,) (computed for the last position whatever `logits` says: one row of
        the head)."""
        n = embeds.shape[1]
        past = kv.length
        kv.reserve(past + n)
        dense = None
        if deepstack is not None and visual_mask is not None:
            rows = visual_mask.reshape(-1).nonzero().view(-1)
            dense = []
            for level in deepstack[:self.deepstack]:
                d = torch.zeros(1, n, self.hidden)
                d[0, rows] = level.float()
                dense.append(d)
        mask = np.ones((1, past + n), dtype=np.int64)
        keys = [k.unsqueeze(0) for k in kv.keys]
        values = [v.unsqueeze(0) for v in kv.values]
        out = self._run(embeds.float(), mask, positions.reshape(3, 1, n).numpy().astype(np.int64), keys, values,
                        dense, 1)
        kv.advance(n)
        return out[0] if logits else None

    def step(self, tokens: list[int], kvs: list[SeqKV], pos: list[SeqPos], chunk: Chunk | None = None):
        """The running tokens as one call, then the prompt's chunk as another (GroupQueryAttention
        takes one new length for every row of a call)."""
        logits = self.decode(tokens, kvs, pos) if tokens else None
        last = None
        if chunk is not None:
            last = self.prefill(chunk.kv, chunk.embeds, chunk.positions, chunk.visual_mask, chunk.deepstack,
                                chunk.logits)
        return logits, last

    @torch.inference_mode()
    def _run(self, embeds: torch.Tensor, mask: np.ndarray, positions: np.ndarray, keys, values, deepstack,
             b: int) -> torch.Tensor:
        n = embeds.shape[1]
        logits = np.empty((b, 1, self.vocab), dtype=np.float32)
        io = self.session.io_binding()
        io.bind_cpu_input("inputs_embeds", embeds.contiguous().numpy())
        io.bind_cpu_input("attention_mask", mask)
        io.bind_cpu_input("position_ids", np.ascontiguousarray(positions))
        if self.deepstack:
            zeros = None
            if deepstack is None:
                if self._zeros.numel() < b * n * self.hidden:
                    self._zeros = torch.zeros(b * n * self.hidden)
                zeros = self._zeros[:b * n * self.hidden].view(b, n, self.hidden).numpy()
            for i in range(self.deepstack):
                level = deepstack[i].numpy() if deepstack is not None and i < len(deepstack) else zeros
                if level is None:  # fewer levels than the graph has: the rest add nothing
                    level = np.zeros((b, n, self.hidden), dtype=np.float32)
                io.bind_cpu_input(f"deepstack_embeds.{i}", level)
        io.bind_ortvalue_output("logits", self.ort.OrtValue.ortvalue_from_numpy(logits))
        for i in range(self.layers):  # past and present share one buffer: new positions are written in place
            for name, out, buf in ((f"past_key_values.{i}.key", f"present.{i}.key", keys[i]),
                                   (f"past_key_values.{i}.value", f"present.{i}.value", values[i])):
                value = self.ort.OrtValue.ortvalue_from_numpy(buf.numpy())
                io.bind_ortvalue_input(name, value)
                io.bind_ortvalue_output(out, value)
        self.session.run_with_iobinding(io)
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


