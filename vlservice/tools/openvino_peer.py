"""OpenVINO GenAI as a peer in our benchmarks, beside llama.cpp's `llama-server` (vlservice/tools/peer.py).

Everything is made here, once, and cached under `VL_CACHE_DIR/openvino/`:

- a tool environment, `venv/` (never the server's requirements): `torch==2.13.0` first (the CPU
  build on this machine's disk), then `transformers` 4.57 (optimum-intel 2.2 refuses 5.x),
  `optimum-intel` 2.2, `openvino`, `openvino-genai`, `nncf`, `pillow`, `numpy`, all under a
  constraint that keeps that torch (so nothing pulls a CUDA torch). PyPI's `torchvision`, which
  optimum-intel requires, is a CUDA build that cannot load beside the CPU torch and breaks the
  `transformers` import, so it is removed again (optimum-intel uses it only for InternVL's
  preprocessing). A marker file says the environment is complete;
- the model, `<fingerprint>/<int4|int8>/`, exported from the same checkpoint our server loads with
  `optimum-cli export openvino --task image-text-to-text` (INT4: `--group-size 128 --ratio 1.0`).
  Our checkpoints are written by transformers 5, whose text config has `rope_parameters` only; the
  export reads `rope_scaling`, so it runs on a temporary folder with a patched copy of config.json
  and links to the other files (the user's checkpoint is never edited).

OpenVINO Model Server is not on PyPI, so the model is served the way OVMS serves a VLM on CPU:
`openvino_genai.ContinuousBatchingPipeline` (this openvino-genai's VLM continuous batching:
`add_request` with the image, one `step()` loop for all running requests, a `SchedulerConfig` with
`max_num_seqs` = the benchmark's parallel streams), behind a small stdlib HTTP server
(openvino_serve.py, run by the tool environment's python) that speaks the OpenAI chat API our
clients send. `pipeline="vlm"` runs `openvino_genai.VLMPipeline` instead (how issue 30's first
OpenVINO rows were made): its `generate` takes one request at a time, so requests wait on a lock.
`INFERENCE_NUM_THREADS` is our server's thread count. The first request's time (OpenVINO compiles
its kernels then) is logged and reported apart in `/health`'s JSON, never mixed into the measurements.

Optional: never part of the test suite's default run or CI (the tool environment is about 1.6 GB
of downloads; the real-size export takes minutes and about 15 GB of memory). Its end-to-end test runs
only with VL_TEST_OPENVINO=1.
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

from .harness import Server

log = logging.getLogger(__name__)

LLM_TYPES = {"int8": "int8", "int4": "int4"}  # our LLM setting -> the OpenVINO weight format beside it
WEIGHTS = {"int8": "INT8 weights (optimum-intel `--weight-format int8`)",
           "int4": "INT4 weights, groups of 128, ratio 1.0 (optimum-intel + NNCF)"}  # what each row's weights are
TORCH = "torch==2.13.0"  # the CPU build on this machine's disk; installed first and held by a constraint
PACKAGES = ["transformers==4.57.*", "optimum-intel==2.2.*", "openvino", "openvino-genai", "nncf", "pillow", "numpy"]
ENV_VERSION = "1"  # bump when the package list changes: the environment is made again
GROUP_SIZE = 128
SERVE_SCRIPT = Path(__file__).with_name("openvino_serve.py")


class ToolEnvError(RuntimeError):
    """A step of making the tool environment failed; the message says which."""


def env_dir(cache_dir: Path) -> Path:
    return Path(cache_dir) / "openvino" / "venv"


def env_python(cache_dir: Path) -> Path:
    return env_dir(cache_dir) / "bin" / "python"


def ensure_env(cache_dir: Path) -> Path:
    """The tool environment's python, made once (a marker file says it is complete)."""
    venv = env_dir(cache_dir)
    python = env_python(cache_dir)
    marker = venv / ".vlservice-ready"
    wanted = json.dumps({"version": ENV_VERSION, "torch": TORCH, "packages": PACKAGES})
    if marker.is_file() and marker.read_text() == wanted and python.is_file():
        return python
    log.info("making the OpenVINO tool environment in %s (once; about 1.6 GB, a few minutes)", venv)
    constraints = venv.parent / "constraints.txt"
    steps = [
        ("python -m venv", [sys.executable, "-m", "venv", str(venv)]),
        (f"pip install {TORCH}", [str(python), "-m", "pip", "install", "-q", TORCH]),
        (f"pip install {' '.join(PACKAGES)}", [str(python), "-m", "pip", "install", "-q", "-c", str(constraints),
                                               *PACKAGES]),
        ("pip uninstall torchvision", [str(python), "-m", "pip", "uninstall", "-q", "-y", "torchvision"]),
    ]
    venv.parent.mkdir(parents=True, exist_ok=True)
    constraints.write_text(TORCH + "\n")
    marker.unlink(missing_ok=True)
    for what, cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join(line for line in proc.stderr.splitlines() if "is ignored" not in line)[-1500:]
            raise ToolEnvError(f"{what} failed (exit {proc.returncode}): {tail}")
    check = subprocess.run([str(python), "-c", "import torch, openvino_genai, optimum.intel; "
                            "assert '+cpu' in torch.__version__, torch.__version__"], capture_output=True, text=True)
    if check.returncode != 0:
        raise ToolEnvError(f"the tool environment does not import: {check.stderr[-1500:]}")
    marker.write_text(wanted)
    return python


def patch_config(config: dict) -> dict:
    """A copy of a transformers-5 Qwen3-VL config that transformers 4.57 (the export's) reads:
    `rope_scaling` (and `rope_theta`) beside the text config's `rope_parameters`."""
    out = json.loads(json.dumps(config))
    text = out.get("text_config", {})
    rope = text.get("rope_parameters")
    if rope and "rope_scaling" not in text:
        text["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
        if "rope_theta" in rope:
            text.setdefault("rope_theta", rope["rope_theta"])
    return out


def _patched_checkpoint(model_dir: Path, into: Path) -> Path:
    """`into`, holding the patched config.json and links to every other file of `model_dir`."""
    for item in Path(model_dir).iterdir():
        if item.name != "config.json":
            (into / item.name).symlink_to(item.resolve())
    config = json.loads((Path(model_dir) / "config.json").read_text())
    (into / "config.json").write_text(json.dumps(patch_config(config), indent=2))
    return into


def group_size_for(model_dir: Path) -> int:
    """128, or for a checkpoint whose language-model widths 128 does not divide (the tiny test one's are
    64; NNCF refuses such a group with InvalidGroupSizeError) the largest power of two that divides them."""
    text = json.loads((Path(model_dir) / "config.json").read_text()).get("text_config", {})
    widths = [text.get("hidden_size", GROUP_SIZE), text.get("intermediate_size", GROUP_SIZE),
              text.get("num_attention_heads", 1) * text.get("head_dim", GROUP_SIZE)]
    group = GROUP_SIZE
    while group > 1 and any(w % group for w in widths):
        group //= 2
    return group


def export_dir(model_dir: Path, cache_dir: Path, weight_format: str, group_size: int = GROUP_SIZE) -> Path:
    from ..engine.model.vision import fingerprint

    name = weight_format if weight_format != "int4" or group_size == GROUP_SIZE else f"int4-g{group_size}"
    return Path(cache_dir) / "openvino" / fingerprint(Path(model_dir), "openvino") / name


def export_command(python: Path, src: Path, out: Path, weight_format: str, group_size: int = GROUP_SIZE) -> list:
    cmd = [str(python), "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(src),
           "--task", "image-text-to-text", "--weight-format", weight_format]
    if weight_format == "int4":
        cmd += ["--group-size", str(group_size), "--ratio", "1.0"]
    return cmd + [str(out)]


def ensure_export(model_dir: Path, cache_dir: Path, weight_format: str, group_size: int = GROUP_SIZE) -> Path:
    """The checkpoint exported to OpenVINO with `weight_format` weights, once per checkpoint and format.
    (`group_size` other than 128 is for checkpoints whose widths it does not divide, as the tiny one's.)"""
    out = export_dir(model_dir, cache_dir, weight_format, group_size)
    if (out / "openvino_language_model.xml").is_file():
        return out
    python = ensure_env(cache_dir)
    part = out.with_name(out.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.parent.mkdir(parents=True, exist_ok=True)
    log.info("exporting %s to OpenVINO %s in %s (once per checkpoint and format)", model_dir, weight_format, out)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vl-openvino-src-") as tmp:
        src = _patched_checkpoint(Path(model_dir), Path(tmp))
        proc = subprocess.run(export_command(python, src, part, weight_format, group_size), capture_output=True,
                              text=True)
    if proc.returncode != 0 or not (part / "openvino_language_model.xml").is_file():
        tail = "\n".join(line for line in proc.stderr.splitlines() if "is ignored" not in line)[-3000:]
        raise RuntimeError(f"optimum-cli export openvino --weight-format {weight_format} failed: {tail}")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(part, out)
    log.info("exported OpenVINO %s in %.0f s", weight_format, time.perf_counter() - t0)
    return out


class OpenVinoServer(Server):
    """openvino_serve.py on one exported model, in the tool environment; waited for and stopped as our
    own server is. `/health` answers 200 once the pipeline is loaded."""

    ready_path = "/health"

    def __init__(self, python: Path, model: Path, parallel: int, threads: int, log_path: Path,
                 pipeline: str = "cb", cache_gb: int = 1):
        from .services import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [str(python), str(SERVE_SCRIPT), "--model", str(model), "--port", str(self.port),
             "--parallel", str(parallel), "--threads", str(threads), "--pipeline", pipeline,
             "--cache-gb", str(cache_gb)],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.watch_pss()

    def health(self) -> dict:
        """The server's load time and, once it has answered one, its first request's times (compile included)."""
        import requests

        return requests.get(self.url + self.ready_path, timeout=10).json()


def start_peer(model_dir: Path, cache_dir: Path, llm: str, parallel: int, threads: int, log_path: Path,
               pipeline: str = "cb", group_size: int | None = None) -> OpenVinoServer:
    python = ensure_env(cache_dir)
    model = ensure_export(model_dir, cache_dir, LLM_TYPES[llm], group_size or group_size_for(model_dir))
    return OpenVinoServer(python, model, parallel, threads, log_path, pipeline)


def main(argv=None) -> int:
    """Make the tool environment and the exports ahead of a benchmark (e.g. while the machine is quiet)."""
    import argparse

    from ..config import Settings

    ap = argparse.ArgumentParser(prog="python -m vlservice.tools.openvino_peer", description=main.__doc__)
    ap.add_argument("--model", type=Path, help="checkpoint folder (default: the benchmark's real-size one)")
    ap.add_argument("--formats", default="int8,int4", help="comma-separated: int8, int4")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cache = Settings.from_env().cache_path
    try:
        ensure_env(cache)
    except ToolEnvError as e:
        print(f"openvino peer: {e}", file=sys.stderr)
        return 2
    if args.model is None:
        from .workloads import bench_model

        args.model, _ = bench_model(cache, False)
    for fmt in args.formats.split(","):
        print(ensure_export(args.model, cache, fmt, group_size_for(args.model)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
