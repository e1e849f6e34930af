"""Which checkpoint to serve: `VL_MODEL` resolved to a local directory.

`resolve()` turns `VL_MODEL` into a local directory: a directory as given, a hub id from the local
Hugging Face cache (or downloaded when the hub is reachable), `demo` for the bundled model. With
nothing configured it tries the default hub model and falls back to the bundled demo model with
a warning. When a configured model cannot be found it raises `ModelLoadError` saying what was
tried and how to fix it.

"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ...config import DEFAULT_HUB_MODEL
from ...errors import ModelLoadError

log = logging.getLogger(__name__)

DEMO_NOTICE = {
    "en": "Demo model: it knows only simple shapes and printed text; set VL_MODEL to serve Qwen3-VL-2B-Instruct.",
    "zh": "演示模型：它只认识简单的图形和印刷文字；设置 VL_MODEL 即可使用 Qwen3-VL-2B-Instruct。",
}



@dataclass(frozen=True)
class ModelSource:
    path: Path
    name: str  # what /v1/models calls it
    is_demo: bool = False
    requested: str = ""


def bundled_demo_path() -> Path:
    return Path(str(resources.files("vlservice").joinpath("assets/demo-model")))


def resolve(model: str) -> ModelSource:
    """`VL_MODEL` to a local checkpoint directory, or ModelLoadError."""
    if model == "demo":
        return _demo(requested="demo")
    if model:
        path = Path(model).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ModelLoadError(f"VL_MODEL={model!r} is a directory without config.json")
            return ModelSource(path=path.resolve(), name=path.name, requested=model)
        if model.startswith((".", "/", "~")) or os.sep in model.strip("/").replace("/", "", 1):
            raise ModelLoadError(f"VL_MODEL={model!r}: no such directory")
        found, tried = _from_hub(model)
        if found is None:
            raise ModelLoadError(
                f"VL_MODEL={model!r} could not be loaded: {tried}. Download it once with "
                f"`huggingface-cli download {model}` (or set VL_MODEL to a local directory, "
                f"or VL_MODEL=demo for the bundled demo model)."
            )
        return ModelSource(path=found, name=model, requested=model)
    found, tried = _from_hub(DEFAULT_HUB_MODEL)
    if found is not None:
        return ModelSource(path=found, name=DEFAULT_HUB_MODEL)
    log.warning(
        "VL_MODEL is not set and %s is not available (%s): serving the bundled DEMO model, which knows "
        "only simple shapes and printed text. Set VL_MODEL to serve Qwen3-VL-2B-Instruct.",
        DEFAULT_HUB_MODEL, tried,
    )
    return _demo(requested="")


def _demo(requested: str) -> ModelSource:
    path = bundled_demo_path()
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"the bundled demo model is missing at {path}; reinstall vlservice")
    return ModelSource(path=path, name="qwen3-vl-demo", is_demo=True, requested=requested)


def _from_hub(repo_id: str) -> tuple[Path | None, str]:
    """The hub checkpoint from the local cache, else downloaded if the hub answers."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.jinja", "*.safetensors", "*.txt", "merges.txt", "vocab.json"]
    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=patterns)), ""
    except Exception as exc:  # not in the cache
        cache_note = f"not in the local Hugging Face cache ({type(exc).__name__})"
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return None, cache_note + "; HF_HUB_OFFLINE is set"
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=5)), ""
    except Exception as exc:
        return None, f"{cache_note}; the hub could not be reached ({type(exc).__name__})"
