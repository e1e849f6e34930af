"""The vision encoder: exported once to ONNX, quantised to INT8, run by ONNX Runtime.

`model.model.visual` is exported with `transformers.exporters.OnnxExporter` for one image with a
dynamic number of patches. The grid-dependent tensors it cannot trace (interpolation indices and
weights of the position table, rotary position ids, cu_seqlens) are computed here with
`transformers.vision_utils` and fed as graph inputs. Several images in one request run one after
another: each image attends only to itself, so the result is the same as one packed call, and
each image's features can be cached on their own. A video's temporal patches run the same way,
one after another, for the same reason.

Files live under `VL_CACHE_DIR/onnx/<fingerprint>/` where the fingerprint covers the checkpoint's
config and weights and the export settings, so a new checkpoint or a new exporter gets new files
and an old export is reused. INT8 is ONNX Runtime's dynamic quantisation (per-channel weights),
leaving the final patch merger in float32 (its output goes straight into the LLM). On a CPU
without VNNI (AVX2 only, or AVX-512 without VNNI) the weights are unsigned 8-bit (in their own
folder `int8-u8`): there ONNX Runtime multiplies unsigned activations by signed weights with an
instruction whose 16-bit pair sums saturate, which took the tiny test model's worst token to
cosine 0.983 against PyTorch and the real-size model's to 0.9987. Measured on an AVX2 EPYC, real
size, a 448x448 photo: signed 8-bit 0.99871 in 2.97 s, 7-bit signed (`reduce_range`, ONNX
Runtime's other advice) 0.99782 in 2.87 s, unsigned 8-bit 0.99923 in 4.30 s: the only one at the
0.999 we hold the encoder to, for 45% more time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock

log = logging.getLogger(__name__)

EXPORT_VERSION = "1"  # bump when the export or quantisation recipe changes
KEEP_FP32_SCOPES = ("merger.",)  # name scopes left in float32 by the INT8 recipe (not deepstack mergers)


@dataclass
class VisionFeatures:
    """What the LLM needs from one image: merged tokens and the deepstack ones."""

    embeds: np.ndarray  # (tokens, hidden) float32
    deepstack: list  # [ (tokens, hidden) float32 ] per deepstack layer

    @property
    def nbytes(self) -> int:
        return self.embeds.nbytes + sum(d.nbytes for d in self.deepstack)


def grid_inputs(visual, grid_thw) -> dict:
    """The grid-dependent tensors the exported graph takes as inputs (torch tensors)."""
    import torch
    from transformers.vision_utils import (
        get_vision_cu_seqlens,
        get_vision_interpolation_indices_and_weights,
        get_vision_position_ids,
    )

    grid = torch.as_tensor([list(grid_thw)], dtype=torch.long)
    indices, weights = get_vision_interpolation_indices_and_weights(
        grid,
        num_grid_per_side=visual.num_grid_per_side,
        mode=visual.interpolation_mode,
        align_corners=visual.interpolation_align_corners,
        spatial_merge_size=visual.spatial_merge_size,
    )
    return {
        "grid_thw": grid,
        "interp_indices": indices,
        "interp_weights": weights,
        "position_ids": get_vision_position_ids(grid, visual.spatial_merge_size),
        "cu_seqlens": get_vision_cu_seqlens(grid),
    }


class TorchVision:
    """The checkpoint's own PyTorch encoder (`VL_VISION_BACKEND=torch`), the reference."""

    name = "torch"

    def __init__(self, visual):
        self.visual = visual

    def __call__(self, pixel_values: np.ndarray, grid_thw: tuple) -> VisionFeatures:
        import torch

        with torch.inference_mode():
            out = self.visual(torch.from_numpy(pixel_values), grid_thw=torch.tensor([list(grid_thw)]))
        return VisionFeatures(
            embeds=out.pooler_output.float().numpy(),
            deepstack=[d.float().numpy() for d in out.deepstack_features],
        )


class OnnxVision:
    """An ONNX Runtime session over the exported encoder (`onnx-fp32` or `onnx-int8`)."""

    def __init__(self, path: Path, visual, threads: int, name: str):
        import onnxruntime as ort

        self.name = name
        self.path = path
        self._visual = visual  # only its grid helpers' parameters (num_grid_per_side, merge size)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.enable_cpu_mem_arena = True
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._wanted = ["pooler_output"] + sorted(n for n in self.output_names if n.startswith("deepstack"))

    def __call__(self, pixel_values: np.ndarray, grid_thw: tuple) -> VisionFeatures:
        t, h, w = (int(x) for x in grid_thw)
        feeds = {k: v.numpy() for k, v in grid_inputs(self._visual, (1, h, w)).items()}
        # A video grid runs as t one-frame grids: the exported graph attends over all of its input
        # at once (the trace fixed the attention's split into frames at one), while Qwen3-VL's
        # vision tower lets each temporal patch attend only to itself, with the same position
        # tables for every one; so this is the same computation (tests/engine/test_video_engine.py).
        outs = []
        for i in range(t):
            feeds["hidden_states"] = pixel_values[i * h * w:(i + 1) * h * w]
            outs.append(self.session.run(self._wanted, {k: feeds[k] for k in self.input_names}))
        if t == 1:
            return VisionFeatures(embeds=outs[0][0], deepstack=list(outs[0][1:]))
        joined = [np.concatenate(parts) for parts in zip(*outs)]
        return VisionFeatures(embeds=joined[0], deepstack=joined[1:])


# What the service holds after `start()`: called per image, its `name` goes into the cache keys.
Encoder = TorchVision | OnnxVision


# --------------------------------------------------------------------------- export

def fingerprint(model_dir: Path, extra: str = "") -> str:
    """A content hash of the checkpoint (config, weight file sizes and edges) and the recipe."""
    import onnxruntime
    import torch
    import transformers

    h = hashlib.sha256()
    h.update((model_dir / "config.json").read_bytes())
    for weights in sorted(model_dir.glob("*.safetensors")):
        size = weights.stat().st_size
        h.update(f"{weights.name}:{size}".encode())
        with open(weights, "rb") as f:
            h.update(f.read(1 << 20))
            f.seek(max(0, size - (1 << 20)))
            h.update(f.read(1 << 20))
    h.update(f"{EXPORT_VERSION}|{transformers.__version__}|{torch.__version__}|{onnxruntime.__version__}|{extra}".encode())
    return h.hexdigest()[:16]


def export_fp32(visual, out_path: Path) -> float:
    """Export `visual` to `out_path` (model.onnx + .data). Returns seconds taken."""
    import torch
    from transformers.exporters import OnnxConfig, OnnxExporter

    t0 = time.perf_counter()
    cfg = visual.config
    factor = cfg.spatial_merge_size
    grid = (1, 4 * factor, 6 * factor)  # a non-square sample grid; the patch count is dynamic
    n = grid[1] * grid[2]
    patch_dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size
    gen = torch.Generator().manual_seed(0)
    inputs = {"hidden_states": torch.randn(n, patch_dim, generator=gen), **grid_inputs(visual, grid)}
    with torch.inference_mode(False), torch.no_grad():
        exported = OnnxExporter().export(visual, inputs, config=OnnxConfig(dynamic=True))
    tmp = Path(tempfile.mkdtemp(dir=out_path.parent.parent))
    try:
        exported.save_pretrained(str(tmp))
        os.replace(tmp, out_path.parent)  # a whole folder appears at once, or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return time.perf_counter() - t0


def cpu_has_vnni() -> bool:
    """Whether this CPU has an 8-bit dot-product instruction (AVX-512 VNNI, AVX-VNNI or AMX)."""
    from ...obs.cpu import cpu_model_and_flags

    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_model_and_flags()[1])


def int8_folder() -> str:
    """The INT8 encoder's folder name: signed weights where the CPU has VNNI, else unsigned."""
    return "int8" if cpu_has_vnni() else "int8-u8"


def quantize_int8(fp32_path: Path, out_path: Path, keep_fp32_scopes=KEEP_FP32_SCOPES,
                  unsigned: bool | None = None) -> float:
    """Dynamic INT8 (per-channel weights) of MatMul/Gemm, except the nodes in `keep_fp32_scopes`;
    `unsigned`: uint8 weights (default: when the CPU has no VNNI, see the module's doc)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    t0 = time.perf_counter()
    proto = onnx.load(str(fp32_path), load_external_data=False)
    exclude = []
    for node in proto.graph.node:
        scopes = {p.key: p.value for p in node.metadata_props}.get("pkg.torch.onnx.name_scopes", "")
        try:
            names = json.loads(scopes.replace("'", '"')) if scopes else []
        except ValueError:
            names = []
        if any(s.startswith(keep_fp32_scopes) or s in ("merger",) for s in names):
            exclude.append(node.name)
    tmp = Path(tempfile.mkdtemp(dir=out_path.parent.parent))
    work = Path(tempfile.mkdtemp(dir=out_path.parent.parent))
    try:
        # quantize_dynamic re-infers shapes; stale value_info on initializers trips it
        initializers = {i.name for i in proto.graph.initializer}
        keep = [v for v in proto.graph.value_info if v.name not in initializers]
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(keep)
        src = tmp / "src.onnx"
        onnx.save(proto, str(src))
        shutil.copyfile(str(fp32_path) + ".data", tmp / (fp32_path.name + ".data"))  # onnx refuses links
        root = logging.getLogger()
        level = root.level
        root.setLevel(max(level, logging.WARNING))  # the quantiser logs every tensor at INFO on the root
        try:
            quantize_dynamic(
                str(src), str(tmp / "q.onnx"),
                per_channel=True,
                weight_type=QuantType.QUInt8 if (not cpu_has_vnni() if unsigned is None else unsigned)
                else QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Gemm"], nodes_to_exclude=exclude,
                use_external_data_format=True,
                extra_options={"MatMulConstBOnly": True},
            )
        finally:
            root.setLevel(level)
        q = onnx.load(str(tmp / "q.onnx"))
        onnx.save(q, str(work / out_path.name), save_as_external_data=True, location=out_path.name + ".data")
        os.replace(work, out_path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    log.info("quantised %s (kept %d nodes in fp32)", out_path.name, len(exclude))
    return time.perf_counter() - t0


def onnx_ready(model_dir: Path, cache_dir: Path, backend: str) -> bool:
    """True when `backend` runs from files already made (no PyTorch vision weights needed)."""
    if backend == "torch":
        return False
    folder = Path(cache_dir) / "onnx" / fingerprint(Path(model_dir))
    return (folder / (int8_folder() if backend == "onnx-int8" else "fp32") / "model.onnx").is_file()


def ensure_onnx(model_dir: Path, visual, cache_dir: Path, backend: str) -> tuple[Path, dict]:
    """The ONNX file for `backend`, exported/quantised once and reused. Returns (path, stats)."""
    key = fingerprint(model_dir)
    folder = cache_dir / "onnx" / key
    folder.mkdir(parents=True, exist_ok=True)
    fp32 = folder / "fp32" / "model.onnx"
    int8 = folder / int8_folder() / "model.onnx"
    stats = {"fingerprint": key, "export_s": 0.0, "quantize_s": 0.0}
    with FileLock(folder / ".lock"):  # two processes (workers, `export`) never export into one folder at once
        if not fp32.is_file():
            log.info("exporting the vision encoder to %s", fp32)
            stats["export_s"] = export_fp32(visual, fp32)
        if backend == "onnx-int8" and not int8.is_file():
            log.info("quantising the vision encoder to INT8")
            stats["quantize_s"] = quantize_int8(fp32, int8, unsigned=int8.parent.name != "int8")
    path = int8 if backend == "onnx-int8" else fp32
    stats["file_bytes"] = sum(p.stat().st_size for p in path.parent.glob("model.onnx*"))
    return path, stats


def load_encoder(backend: str, model_dir: Path, visual, cache_dir: Path, threads: int) -> tuple[Encoder, dict]:
    """The encoder for `backend` and its export statistics."""
    if backend == "torch":
        return TorchVision(visual), {"export_s": 0.0, "quantize_s": 0.0}
    path, stats = ensure_onnx(model_dir, visual, cache_dir, backend)
    return OnnxVision(path, visual, threads, backend), stats
