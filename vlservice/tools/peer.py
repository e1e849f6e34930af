"""llama.cpp's `llama-server` as a peer in our benchmarks: the server people would pick instead.

Everything is built here, once, and cached under `VL_CACHE_DIR/llama.cpp/`:

- the server, from the `llama-cpp-python` source package (`pip download --no-binary :all:`), whose
  vendored llama.cpp is compiled with cmake for this CPU (`GGML_NATIVE`): `llama-server` only;
- the model, from the same checkpoint our server loads, converted with llama.cpp's own
  `convert_hf_to_gguf.py` (its `gguf` package from the same source): the language model as
  `f32` (beside our float32 LLM) or `q8_0` (beside our INT8 LLM), the vision projector as `f16`;
  beside our 4-bit LLM, `Q4_K_M` (what Ollama and LM Studio users run by default), made by
  llama.cpp's own `llama-quantize` from that `f32` file.

`LlamaServer` has the interface of `concurrency.Server` (`url`, `wait_ready`, `stop`) and speaks
the same OpenAI chat API, so the same clients measure both. Requests to it add `ignore_eos`, the
way to force a token count there (our server's `min_tokens`). Optional: never part of the test
suite (a build took 25 minutes on 2 cores here and needs PyPI or a local copy of the package).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from .harness import Server

log = logging.getLogger(__name__)

PACKAGE = "llama-cpp-python"
LLM_TYPES = {"float32": "f32", "int8": "q8_0", "int4": "q4_k_m"}  # our LLM -> the GGUF type beside it
WEIGHTS = {"float32": "f32 LLM, f16 projector", "int8": "Q8_0 LLM (8.5 bits per weight), f16 projector",
           "int4": "Q4_K_M LLM (4- and 6-bit k-quants), f16 projector"}  # what each row's weights are
QUANTIZED = {"q4_k_m": "Q4_K_M"}  # types llama-quantize makes from the f32 file (the converter cannot)


def _source(root: Path) -> Path:
    """The vendored llama.cpp of the newest `llama-cpp-python` source package under `root` (fetched
    with pip when there is none)."""
    tarballs = sorted(root.glob("llama_cpp_python-*.tar.gz"))
    if not tarballs:
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", PACKAGE,
                        "-d", str(root)], check=True)
        tarballs = sorted(root.glob("llama_cpp_python-*.tar.gz"))
    tarball = tarballs[-1]
    folder = root / tarball.name[: -len(".tar.gz")]
    if not (folder / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        with tarfile.open(tarball) as tar:
            tar.extractall(root, filter="data")
    return folder / "vendor" / "llama.cpp"


def ensure_server(cache_dir: Path) -> tuple[Path, Path]:
    """(the `llama-server` binary, the llama.cpp source folder), built once."""
    src = _source(Path(cache_dir) / "llama.cpp")
    binary = src / "build" / "bin" / "llama-server"
    if not binary.is_file():
        log.info("building llama-server from %s (once; 25 minutes on 2 cores here)", src)
        subprocess.run(["cmake", "-S", str(src), "-B", str(src / "build"), "-DCMAKE_BUILD_TYPE=Release",
                        "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON"], check=True, capture_output=True)
    if not binary.is_file() or not (src / "build" / "bin" / "llama-quantize").is_file():
        subprocess.run(["cmake", "--build", str(src / "build"), "-j", str(os.cpu_count() or 2),
                        "--target", "llama-server", "llama-quantize"], check=True, capture_output=True)
    return binary, src


def ensure_gguf(model_dir: Path, cache_dir: Path, llm: str) -> tuple[Path, Path]:
    """(the language model as GGUF of the type matching our `llm`, the f16 vision projector),
    converted once from `model_dir` with the vendored converter."""
    from ..engine.model.vision import fingerprint

    _, src = ensure_server(cache_dir)
    out = Path(cache_dir) / "llama.cpp" / "gguf" / fingerprint(Path(model_dir), "gguf")
    out.mkdir(parents=True, exist_ok=True)
    outtype = LLM_TYPES[llm]
    text, mmproj = out / f"model-{outtype}.gguf", out / "mmproj-f16.gguf"
    if outtype in QUANTIZED:
        return _quantized(ensure_gguf(model_dir, cache_dir, "float32")[0], text, src), mmproj
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src / "gguf-py"), os.environ.get("PYTHONPATH", "")])}
    for path, extra in ((text, ["--outtype", outtype]), (mmproj, ["--mmproj", "--outtype", "f16"])):
        if path.is_file():
            continue
        log.info("converting %s to %s", model_dir, path.name)
        tmp = path.with_suffix(".part")
        proc = subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_dir), "--outfile",
                               str(tmp), *extra], env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not tmp.is_file():
            raise RuntimeError(f"converting to {path.name} failed: {proc.stderr[-2000:]}")
        os.replace(tmp, path)
    return text, mmproj


def _quantized(f32: Path, path: Path, src: Path) -> Path:
    """`path` (model-<type>.gguf) quantized from the f32 GGUF by llama.cpp's `llama-quantize`, once."""
    if not path.is_file():
        kind = QUANTIZED[path.stem.split("-", 1)[1]]
        log.info("quantizing %s to %s", f32.name, kind)
        tmp = path.with_suffix(".part")
        proc = subprocess.run([str(src / "build" / "bin" / "llama-quantize"), str(f32), str(tmp), kind],
                              capture_output=True, text=True)
        if proc.returncode != 0 or not tmp.is_file():
            raise RuntimeError(f"llama-quantize to {kind} failed: {proc.stderr[-2000:]}")
        os.replace(tmp, path)
    return path


class LlamaServer(Server):
    """`llama-server` with `parallel` slots on one model, started the way its README shows; waited
    for and stopped as our own server is."""

    ready_path = "/health"

    def __init__(self, binary: Path, model: Path, mmproj: Path, parallel: int, threads: int, ctx_per_slot: int,
                 log_path: Path):
        from .services import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [str(binary), "-m", str(model), "--mmproj", str(mmproj), "--host", "127.0.0.1", "--port", str(self.port),
             "-np", str(parallel), "-c", str(ctx_per_slot * parallel), "-t", str(threads), "-tb", str(threads),
             "--no-webui", "--cache-ram", "0"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.watch_pss()


def start_peer(model_dir: Path, cache_dir: Path, llm: str, parallel: int, threads: int, log_path: Path,
               ctx_per_slot: int = 4096) -> LlamaServer:
    binary, _ = ensure_server(cache_dir)
    text, mmproj = ensure_gguf(model_dir, cache_dir, llm)
    return LlamaServer(binary, text, mmproj, parallel, threads, ctx_per_slot, log_path)


def missing() -> str:
    """What this machine lacks to build and convert the peer, in one line ("" when nothing)."""
    import importlib.util

    lacks = []
    if not shutil.which("cmake") or not (shutil.which("c++") or shutil.which("g++")):
        lacks.append("cmake and a C++ compiler (apt-get install cmake g++)")
    if importlib.util.find_spec("sentencepiece") is None:  # llama.cpp's converter imports it for every Qwen
        lacks.append("sentencepiece (.venv/bin/pip install sentencepiece)")
    return "; ".join(lacks)
