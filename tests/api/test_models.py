"""Which model is served: VL_MODEL as a directory, `demo`, unset (the default hub model if cached,
else the bundled demo model with a warning everywhere), or wrong (startup fails, saying why)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from conftest import ARTIFACTS, ROOT

pytestmark = pytest.mark.server


def test_unset_model_falls_back_to_the_demo_and_says_so(tmp_path, cache_dir):
    from server import ServerProcess

    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VL_MODEL": "", "HF_HOME": str(tmp_path / "hf"), "VL_CACHE_DIR": str(cache_dir)}
    with ServerProcess(env, ARTIFACTS / "server-default.log") as srv:
        entry = requests.get(srv.url + "/v1/models").json()["data"][0]
        assert entry["id"] == "qwen3-vl-demo" and entry["demo"] is True and "VL_MODEL" in entry["notice"]
        ready = requests.get(srv.url + "/readyz").json()
        assert ready["demo"] is True and "simple shapes" in ready["notice"]
        config = requests.get(srv.url + "/api/config").json()
        assert config["demo"] is True and "演示模型" in config["demo_notice"]["zh"]
        assert "serving the bundled DEMO model" in srv.log_text()


@pytest.mark.parametrize("value,expected", [
    ("/nonexistent/qwen-checkpoint", "no such directory"),
    ("someone/not-a-cached-model", "could not be loaded"),
])
def test_a_configured_model_that_cannot_load_stops_the_start(tmp_path, value, expected):
    env = {**os.environ, "VL_MODEL": value, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
           "VL_BIND": "127.0.0.1:0"}
    proc = subprocess.run([sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert expected in proc.stderr and value in proc.stderr


def test_resolve_directory_and_demo(tiny_model_dir):
    from vlservice.errors import ModelLoadError
    from vlservice.engine.model.checkpoints import resolve

    src = resolve(str(tiny_model_dir))
    assert src.path == tiny_model_dir.resolve() and not src.is_demo
    demo = resolve("demo")
    assert demo.is_demo and (demo.path / "model.safetensors").is_file()
    assert (demo.path / "model.safetensors").stat().st_size <= 20 * 2**20
    with pytest.raises(ModelLoadError):
        resolve(str(tiny_model_dir / "missing"))
