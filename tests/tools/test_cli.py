"""The command-line interface, run for real as `python -m vlservice ...` subprocesses.

Each model-loading subprocess takes a few seconds (model load, ONNX export the first time), so
the expensive runs are few and their results are shared between assertions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, png_bytes, scene

COMMANDS = ["make-test-model", "export", "chat", "serve", "bench", "train-demo", "eval-demo", "compare", "soak", "edge"]


@pytest.fixture(scope="module")
def cli_env(tiny_model_dir, cache_dir):
    env = dict(os.environ)
    env.update(VL_MODEL=str(tiny_model_dir), VL_CACHE_DIR=str(cache_dir), HF_HUB_OFFLINE="1",
               VL_VISION_BACKEND="onnx-fp32", VL_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("VL_LOG_LEVEL", None)
    return env


def run_cli(env, *args, timeout=180):
    return subprocess.run([sys.executable, "-m", "vlservice", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli-images") / "scene.png"
    path.write_bytes(png_bytes(scene()))
    return path


# --------------------------------------------------------------------------- no model needed

def test_help_names_every_command(cli_env):
    r = run_cli(cli_env, "--help")
    assert r.returncode == 0, r.stderr
    for name in COMMANDS:
        assert name in r.stdout
    for line in r.stdout.splitlines():  # one line of help per command
        words = line.split()
        if words and words[0] in COMMANDS:
            assert len(words) > 1, line


def test_missing_image_path_exits_2_before_loading(cli_env, tmp_path):
    missing = tmp_path / "nope.png"
    r = run_cli(cli_env, "chat", "--image", missing, "What is this?")
    assert r.returncode == 2
    assert "error:" in r.stderr and str(missing) in r.stderr
    assert "not found" in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_is_dispatched_and_has_help(cli_env, name):
    import importlib.util

    from vlservice import cli

    if name in cli.PASSTHROUGH:  # its own module, which must be there and receive the arguments
        assert importlib.util.find_spec(cli.PASSTHROUGH[name][0]) is not None
    r = run_cli(cli_env, name, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:") and "not available" not in r.stderr


def test_an_unknown_command_exits_2_naming_it(cli_env):
    r = run_cli(cli_env, "frobnicate", "x")
    assert r.returncode == 2 and r.stdout == ""
    assert "invalid choice: 'frobnicate'" in r.stderr and "soak" in r.stderr  # and what would have worked


def test_serve_execs_gunicorn_with_bind(monkeypatch, tmp_path):
    import importlib.util

    from vlservice import cli

    (tmp_path / "gunicorn.conf.py").write_text("")
    called = {}

    def fake_exec(file, argv):
        called.update(file=file, argv=argv, bind=os.environ.get("VL_BIND"), workers=os.environ.get("VL_WORKERS"))
        raise SystemExit(0)

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(cli, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(cli.os, "execvp", fake_exec)
    monkeypatch.setattr(cli.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "gunicorn" else real_find_spec(name, *a))
    saved = dict(os.environ)
    try:
        with pytest.raises(SystemExit):
            cli.main(["serve", "--bind", "127.0.0.1:8123", "--workers", "2"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert called["file"] == sys.executable
    assert called["argv"] == [sys.executable, "-m", "gunicorn", "-c", str(tmp_path / "gunicorn.conf.py"), "wsgi:app"]
    assert called["bind"] == "127.0.0.1:8123" and called["workers"] == "2"
    assert cli.main(["serve", "--bind", "nonsense"]) == 2


def test_repo_root_is_parent_of_package():
    from vlservice import cli

    assert cli.REPO_ROOT == ROOT
    assert (cli.REPO_ROOT / "vlservice" / "cli.py").is_file()


# --------------------------------------------------------------------------- with the tiny model

def test_make_test_model_loads_with_autotokenizer(cli_env, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "made"
    r = run_cli(cli_env, "make-test-model", out, "--seed", "3", "--vocab-limit", "2000")
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == out.resolve()
    for name in ("config.json", "model.safetensors", "tokenizer_config.json", "preprocessor_config.json"):
        assert (out / name).is_file(), name
    assert list(out.glob("tokenizer*.json")) or (out / "vocab.json").is_file()
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok("a cat").input_ids
    assert len(tok) < 5000  # the vocabulary limit took effect
    assert json.loads((out / "config.json").read_text())["text_config"]["vocab_size"] >= len(tok)


def test_export_fp32_prints_an_existing_path(cli_env):
    r = run_cli(cli_env, "export", "--backend", "onnx-fp32")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("onnx-fp32: ")
    path = Path(line.split()[1])
    assert path.is_file() and path.suffix == ".onnx"
    assert "export" in line and "quantize" in line


def test_export_with_int4_builds_the_decoder_once_and_chat_answers_with_it(cli_env, image_path):
    env = {**cli_env, "VL_LLM_QUANT": "int4"}
    first = run_cli(env, "export", "--backend", "onnx-fp32")
    assert first.returncode == 0, first.stderr
    line = first.stdout.strip().splitlines()[-1]
    assert line.startswith("llm-int4: ")
    path = Path(line.split()[1])
    assert path.is_file() and path.name == "model.onnx"
    again = run_cli(env, "export", "--backend", "onnx-fp32")
    assert again.returncode == 0 and "(already built)" in again.stdout.strip().splitlines()[-1]
    r = run_cli(env, "chat", "--json", "--image", image_path, "--max-tokens", "5", "Describe this image.")
    assert r.returncode == 0, r.stderr
    assert 1 <= json.loads(r.stdout)["usage"]["completion_tokens"] <= 5


def test_chat_json(cli_env, image_path):
    r = run_cli(cli_env, "chat", "--json", "--image", image_path, "--max-tokens", "5", "Describe this image.")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # the whole of stdout is one JSON object
    assert set(out) == {"answer", "finish_reason", "usage", "timings"}
    assert isinstance(out["answer"], str) and out["answer"]
    assert 1 <= out["usage"]["completion_tokens"] <= 5
    assert out["finish_reason"] in ("stop", "length")
    for key in ("vision_encode_ms", "prompt_ms", "ttft_ms", "total_ms"):
        assert key in out["timings"], key


def test_chat_streams_answer_and_prints_timings(cli_env, image_path):
    r = run_cli(cli_env, "chat", "--image", image_path, "--system", "Be brief.", "--max-tokens", "4",
                "--temperature", "0.7", "--seed", "1", "What is here?")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "vision_encode" not in r.stdout and "timings" not in r.stdout
    assert "vision_encode" in r.stderr and "tokens/s" in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.rstrip().endswith(" ms")]
    assert lines and len({ln.index(" ms") for ln in lines}) == 1  # aligned


def test_chat_non_image_exits_2(cli_env, tmp_path):
    bad = tmp_path / "notes.png"
    bad.write_text("this is not an image\n")
    r = run_cli(cli_env, "chat", "--image", bad, "What is this?")
    assert r.returncode == 2
    assert "error:" in r.stderr
    assert r.stdout == ""


@pytest.mark.server
def test_memory_command_reports_each_gunicorn_process(cli_env, tmp_path):
    """`python -m vlservice.tools.memory` starts Gunicorn as users do and reads every process's memory."""
    out = tmp_path / "mem.json"
    env = {**cli_env, "VL_WARMUP": "0", "VL_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice.tools.memory", "--workers", "1", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    roles = sorted(r["role"] for r in report["processes"])
    assert roles == ["master", "worker"]
    for r in report["processes"]:
        assert 0 < r["uss_mib"] <= r["pss_mib"] <= r["rss_mib"] <= r["peak_rss_mib"]
        assert abs(r["pss_anon_mib"] + r["pss_file_mib"] - r["pss_mib"]) <= 2  # the split adds up
    assert report["cpu"]["model"] and report["cpu"]["threads"] == 1 and report["llm"] == "float32"
    assert report["max_peak_rss_mib"] == max(r["peak_rss_mib"] for r in report["processes"])
    assert "| total |" in proc.stdout
