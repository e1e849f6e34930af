"""Memory and speed levers on the PyTorch side, both opt-in or safe by construction.

- `VL_LLM_QUANT=int8`: every `nn.Linear` of the language model and the LM head becomes PyTorch's
  dynamically quantised INT8 linear (per-output-channel int8 weights, int8 activations quantised
  on the fly, fbgemm kernels). Decoding reads a quarter of the bytes; answers can differ from
  float32 (`python -m vlservice compare` measures by how much on your own images).
  The quantised weights are built once, in a child process (`python -m vlservice.engine.model.quant`), and
  stored under `VL_CACHE_DIR/llm-int8/<fingerprint>/`; the server then builds the model skeleton
  without memory (`torch.device("meta")`), puts the INT8 layers in, and reads from the checkpoint
  only what stays in float (embedding, norms; the vision tower only when PyTorch runs it or the
  ONNX export still has to be made). The float32 linear weights never enter the server process.
- `release_torch_vision(model)`: with an ONNX vision backend the PyTorch vision tower's weights are
  never used again (only its grid parameters are), so they are freed: 1.6 GB for the real model.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from safetensors import safe_open

log = logging.getLogger(__name__)

INT8_VERSION = 1  # bump when the stored format or the recipe changes


def _dynamic_linear():
    from torch.ao.nn.quantized.dynamic import Linear

    return Linear


def quantize_llm_int8(model) -> float:
    """Quantise the language model's linears and the head in place; returns seconds taken."""
    import torch

    t0 = time.perf_counter()
    text = model.model.language_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        spec = {torch.nn.Linear: per_channel_dynamic_qconfig}
        for layer in text.layers:
            quantize_dynamic(layer, spec, dtype=torch.qint8, inplace=True)
        # The head is tied to the embedding: untie it (the embedding stays float for lookups),
        # then quantise the head alone; it is read in full for every generated token.
        head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False)
        head.weight = torch.nn.Parameter(model.lm_head.weight.detach().float().clone(), requires_grad=False)
        model.lm_head = quantize_dynamic(torch.nn.Sequential(head), spec, dtype=torch.qint8)[0]
    seconds = time.perf_counter() - t0
    log.info("LLM quantised to INT8 in %.1f s", seconds)
    return seconds


# --------------------------------------------------------------------------- stored INT8 weights

def int8_path(model_dir: Path, cache_dir: Path) -> Path:
    from .vision import fingerprint

    return Path(cache_dir) / "llm-int8" / fingerprint(Path(model_dir), f"llm-int8-{INT8_VERSION}") / "llm-int8.safetensors"


def save_int8(model, path: Path) -> int:
    """Write every quantised linear of `model` (int8 weights, per-channel scales) to `path`."""
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for name, mod in model.named_modules():
        if isinstance(mod, _dynamic_linear()):
            w, b = mod._packed_params._weight_bias()
            if w.qscheme() != torch.per_channel_affine:
                raise ValueError(f"{name}: expected per-channel weights, got {w.qscheme()}")
            tensors[f"{name}.qweight"] = w.int_repr().contiguous()
            tensors[f"{name}.scales"] = w.q_per_channel_scales().double().contiguous()
            tensors[f"{name}.zero_points"] = w.q_per_channel_zero_points().long().contiguous()
            if b is not None:
                tensors[f"{name}.bias"] = b.detach().float().contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file(tensors, str(tmp), metadata={"format": "vlservice-llm-int8", "version": str(INT8_VERSION)})
    os.replace(tmp, path)
    return path.stat().st_size


def build_int8(model_dir: Path, out: Path) -> dict:
    """Load the float checkpoint, quantise the LLM, store it. Runs in a child process."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    t0 = time.perf_counter()
    model = Qwen3VLForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model.requires_grad_(False)
    load_s = time.perf_counter() - t0
    quantize_s = quantize_llm_int8(model)
    size = save_int8(model, out)
    return {"load_s": load_s, "quantize_s": quantize_s, "file_bytes": size, "path": str(out)}


def ensure_int8(model_dir: Path, cache_dir: Path) -> tuple[Path, dict]:
    """The stored INT8 weights of `model_dir`, built once in a child process so that the float32
    weights never occupy the server's memory."""
    from filelock import FileLock

    path = int8_path(model_dir, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    stats = {"build_s": 0.0}
    with FileLock(path.parent / ".lock"):  # workers starting together build it once
        if not path.is_file():
            log.info("quantising the LLM to INT8 once (stored in %s)", path.parent)
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "vlservice.engine.model.quant", "--model", str(model_dir),
                                   "--out", str(path)], capture_output=True, text=True)
            if proc.returncode != 0 or not path.is_file():
                raise RuntimeError(f"building the INT8 LLM failed: {proc.stderr.strip()[-2000:]}")
            stats["build_s"] = time.perf_counter() - t0
    stats["file_bytes"] = path.stat().st_size
    return path, stats



def _float_embedding_class():
    import torch

    class LookupEmbedding(torch.nn.Module):
        """An embedding kept in the checkpoint's dtype (bfloat16 for Qwen3-VL: lossless, half of
        float32's memory) whose lookups come out in float32."""

        def __init__(self, weight):
            super().__init__()
            self.weight = torch.nn.Parameter(weight, requires_grad=False)
            self.num_embeddings, self.embedding_dim = weight.shape
            self.padding_idx = None

        def forward(self, ids):
            return torch.nn.functional.embedding(ids, self.weight).float()

    return LookupEmbedding


def _read_tensors(path: Path, keys) -> dict:
    """Copies of `keys` from a safetensors file, the file mapped for one tensor at a time: through a
    single `safe_open` every page read stays resident until the handle closes, on top of the packed
    copies, which took the peak of a real-size INT8 load to 4.1 GiB."""
    from safetensors import safe_open

    out = {}
    for key in keys:
        with safe_open(str(path), "pt") as f:
            if key in f.keys():
                out[key] = f.get_tensor(key).clone()
    return out


class _Checkpoint:
    """Tensors of a (possibly sharded) safetensors checkpoint by name. `safe_open` maps the files
    and returns tensors backed by that mapping: the embedding (1.2 GB in float32, 0.6 GB in the
    real checkpoint's bfloat16) is then read from the page cache row by row as tokens use it and
    shared by every worker, instead of copied whole into each process."""

    def __init__(self, model_dir: Path):
        from safetensors import safe_open

        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
        else:
            weight_map = {}
            for f in sorted(model_dir.glob("*.safetensors")):
                with safe_open(str(f), "pt") as h:
                    weight_map.update({k: f.name for k in h.keys()})
        self.dir, self.weight_map = model_dir, weight_map
        self._open: dict[str, safe_open] = {}  # file name -> its open handle
        self._safe_open = safe_open

    # Older Qwen-VL checkpoints name the towers without the `model.` wrapper (transformers renames
    # them on load); accept both spellings.
    ALIASES = (("model.language_model.", "model."), ("model.visual.", "visual."))

    def _key(self, key):
        if key in self.weight_map:
            return key
        for new, old in self.ALIASES:
            if key.startswith(new) and old + key[len(new):] in self.weight_map:
                return old + key[len(new):]
        return None

    def __contains__(self, key):
        return self._key(key) is not None

    def get(self, key):
        key = self._key(key)
        name = self.weight_map[key]
        if name not in self._open:
            self._open[name] = self._safe_open(str(self.dir / name), "pt")
        return self._open[name].get_tensor(key)


def load_int8_model(model_dir: Path, cache_dir: Path, need_vision: bool):
    """The model with its LLM in INT8 from the store, built without materialising float32 linears.
    Returns (model, stats)."""
    import torch
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    model_dir = Path(model_dir)
    path, stats = ensure_int8(model_dir, cache_dir)
    t0 = time.perf_counter()
    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(config)
    Linear = _dynamic_linear()
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        names = sorted({k.rsplit(".", 1)[0] for k in f.keys()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantised-tensor constructors warn of a future deprecation
        for name in names:
            t = _read_tensors(path, [f"{name}.{part}" for part in ("qweight", "scales", "zero_points", "bias")])
            q = t[f"{name}.qweight"]
            weight = torch._make_per_channel_quantized_tensor(q, t[f"{name}.scales"], t[f"{name}.zero_points"], 0)
            bias = t.get(f"{name}.bias")
            lin = Linear(q.shape[1], q.shape[0], bias_=bias is not None, dtype=torch.qint8)
            lin.set_weight_bias(weight, bias)
            model.set_submodule(name, lin)
    _fill_from_checkpoint(model, model_dir, need_vision)
    model.eval().requires_grad_(False)
    stats["load_s"] = time.perf_counter() - t0
    log.info("loaded the INT8 LLM from %s in %.1f s", path, stats["load_s"])
    return model, stats


def load_embedding_model(model_dir: Path, need_vision: bool):
    """The model's frame for `VL_LLM_QUANT=int4`, where ONNX Runtime runs the whole language model
    (ortdecode.py): only the token embedding (mapped from the checkpoint in its own dtype), the
    rotary tables and, when the encoder still has to be exported, the vision tower hold data; the
    language model's layers and head stay empty. Returns the model."""
    import torch
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(config)
    _fill_from_checkpoint(model, model_dir, need_vision, text=False)
    model.eval().requires_grad_(False)
    return model


def _fill_from_checkpoint(model, model_dir: Path, need_vision: bool, text: bool = True) -> None:
    """Give every parameter still on the meta device its checkpoint tensor: the embedding mapped in
    its dtype, the vision tower's only when `need_vision`, the language model's other float ones
    (norms; with `text=False`, none: they stay empty) in float32; then the non-persistent buffers
    and the generation config."""
    import torch
    from transformers import GenerationConfig

    ckpt = _Checkpoint(model_dir)
    embed_key = "model.language_model.embed_tokens.weight"
    if embed_key not in ckpt:
        raise RuntimeError(f"{model_dir}: no {embed_key} in the checkpoint")
    embed = ckpt.get(embed_key)
    if embed.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        embed = embed.float()
    model.model.language_model.embed_tokens = _float_embedding_class()(embed)
    for name, param in list(model.named_parameters()):
        if param.device.type != "meta":
            continue
        module_name, attr = name.rsplit(".", 1)
        module = model.get_submodule(module_name)
        vision = name.startswith("model.visual.")
        if (vision and not need_vision) or (not vision and not text):
            value = torch.empty(0)
        elif name in ckpt:
            value = ckpt.get(name).float()
        else:
            raise RuntimeError(f"{model_dir}: no {name} in the checkpoint")
        module._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)
    for _, module in list(model.named_modules()):  # non-persistent buffers (rotary tables)
        meta = [n for n, b in module.named_buffers(recurse=False) if b.device.type == "meta"]
        if meta:
            fresh = type(module)(module.config)
            for n in meta:
                module._buffers[n] = getattr(fresh, n)
    if (model_dir / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(model_dir))


def release_torch_vision(model) -> int:
    """Free the vision tower's weights (ONNX Runtime has its own copy); returns bytes freed."""
    import torch

    freed = 0
    for p in model.model.visual.parameters():
        freed += p.numel() * p.element_size()
        p.data = torch.empty(0, dtype=p.dtype)
    return freed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vlservice.engine.model.quant",
                                 description="Quantise a checkpoint's LLM to INT8 and store it (the server "
                                             "runs this itself, once, when VL_LLM_QUANT=int8).")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import torch

    from ...config import _physical_cores

    torch.set_num_threads(_physical_cores())
    print(json.dumps(build_int8(args.model, args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
