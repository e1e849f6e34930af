"""OpenVINO GenAI as a benchmark peer (vlservice/tools/openvino_peer.py): its setup code on the tiny
checkpoint. The peer is optional and never part of CI: the fast tests here touch no tool environment;
the end-to-end one makes it (about 1.6 GB from PyPI, under VL_CACHE_DIR/openvino, reused after), exports
the tiny checkpoint to INT4 and streams an answer about an image, and runs only with VL_TEST_OPENVINO=1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vlservice.tools import concurrency, openvino_peer


def test_config_patch_puts_rope_scaling_beside_rope_parameters(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    before = json.dumps(config)
    patched = openvino_peer.patch_config(config)
    assert json.dumps(config) == before  # a copy: the original is not touched
    text, rope = patched["text_config"], config["text_config"]["rope_parameters"]
    assert text["rope_parameters"] == rope
    assert text["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
    assert text["rope_scaling"]["mrope_section"] == rope["mrope_section"]
    assert text["rope_theta"] == rope["rope_theta"]
    assert patched["vision_config"] == config["vision_config"]
    assert openvino_peer.patch_config(patched) == patched  # a config that has it already stays as it is


def test_patched_checkpoint_links_everything_else(tiny_model_dir, tmp_path):
    before = (tiny_model_dir / "config.json").read_bytes()
    src = openvino_peer._patched_checkpoint(tiny_model_dir, tmp_path)
    assert sorted(p.name for p in src.iterdir()) == sorted(p.name for p in tiny_model_dir.iterdir())
    assert not (src / "config.json").is_symlink()
    assert "rope_scaling" in json.loads((src / "config.json").read_text())["text_config"]
    weights = src / "model.safetensors"
    assert weights.is_symlink() and weights.resolve() == (tiny_model_dir / "model.safetensors").resolve()
    assert (tiny_model_dir / "config.json").read_bytes() == before


def test_export_command_and_folder(tiny_model_dir, tmp_path):
    py, src, out = Path("/env/bin/python"), Path("/src"), Path("/out")
    cmd = openvino_peer.export_command(py, src, out, "int4")
    assert cmd[:3] == [str(py), "-m", "optimum.commands.optimum_cli"]
    assert cmd[3:] == ["export", "openvino", "--model", "/src", "--task", "image-text-to-text", "--weight-format",
                       "int4", "--group-size", "128", "--ratio", "1.0", "/out"]
    assert "--group-size" not in openvino_peer.export_command(py, src, out, "int8")
    int4 = openvino_peer.export_dir(tiny_model_dir, tmp_path, "int4")
    assert int4.name == "int4" and int4.parent.parent == tmp_path / "openvino"
    assert openvino_peer.export_dir(tiny_model_dir, tmp_path, "int8") == int4.with_name("int8")
    assert openvino_peer.export_dir(tiny_model_dir, tmp_path, "int4", 64).name == "int4-g64"
    assert openvino_peer.group_size_for(tiny_model_dir) == 64  # hidden 64: NNCF refuses a group of 128
    real = {"text_config": {"hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 16, "head_dim": 128}}
    (tmp_path / "config.json").write_text(json.dumps(real))  # Qwen3-VL-2B's widths
    assert openvino_peer.group_size_for(tmp_path) == 128


def test_tool_environment_is_reused_once_marked(tmp_path, monkeypatch):
    venv = openvino_peer.env_dir(tmp_path)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".vlservice-ready").write_text(json.dumps({"version": openvino_peer.ENV_VERSION, "torch": openvino_peer.TORCH,
                                                       "packages": openvino_peer.PACKAGES}))

    def no_run(*a, **k):
        raise AssertionError("nothing is installed again")

    monkeypatch.setattr(openvino_peer.subprocess, "run", no_run)
    assert openvino_peer.ensure_env(tmp_path) == venv / "bin" / "python"


def test_a_failed_install_says_which_and_exits_2(tmp_path, monkeypatch, capsys):
    class Failed:
        returncode, stdout, stderr = 1, "", "ERROR: No matching distribution found for openvino-genai"

    calls = []
    monkeypatch.setattr(openvino_peer.subprocess, "run", lambda cmd, **k: calls.append(cmd) or Failed())
    monkeypatch.setenv("VL_CACHE_DIR", str(tmp_path))
    assert concurrency.main(["--peer", "openvino", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "bench --peer openvino: python -m venv failed (exit 1)" in err
    assert "No matching distribution found for openvino-genai" in err
    assert len(calls) == 1 and not (tmp_path / "out").exists()  # stopped before anything was measured


def test_the_install_order_keeps_the_cpu_torch(tmp_path, monkeypatch):
    class Ok:
        returncode, stdout, stderr = 0, "", ""

    calls: list = []
    monkeypatch.setattr(openvino_peer.subprocess, "run", lambda cmd, **k: calls.append(cmd) or Ok())
    openvino_peer.env_dir(tmp_path).mkdir(parents=True)  # what `python -m venv` would have made
    openvino_peer.ensure_env(tmp_path)
    installs = [c for c in calls if "install" in c]
    assert installs[0][-1] == "torch==2.13.0"  # first, alone
    rest = installs[1]
    assert rest[rest.index("-c") + 1] == str(tmp_path / "openvino" / "constraints.txt")
    assert (tmp_path / "openvino" / "constraints.txt").read_text().strip() == "torch==2.13.0"
    assert "transformers==4.57.*" in rest and "optimum-intel==2.2.*" in rest
    assert (openvino_peer.env_dir(tmp_path) / ".vlservice-ready").is_file()


def test_peer_choices_and_pipeline_option(monkeypatch, tmp_path):
    seen = {}

    def fake_measure(args, model_dir, out):
        seen.update(peer=args.peer, pipeline=args.openvino_pipeline)
        raise SystemExit(0)

    monkeypatch.setattr(concurrency, "_openvino_env", lambda: 0)
    monkeypatch.setattr(concurrency, "start_report", lambda args: (None, None, {}))
    monkeypatch.setattr(concurrency, "measure", fake_measure)
    with pytest.raises(SystemExit):
        concurrency.main(["--peer", "openvino", "--openvino-pipeline", "vlm", "--out", str(tmp_path)])
    assert seen == {"peer": ["openvino"], "pipeline": "vlm"}
    with pytest.raises(SystemExit) as bad:
        concurrency.main(["--peer", "ollama"])
    assert bad.value.code == 2


def test_no_openvino_peer_beside_float32(tmp_path, monkeypatch):
    import argparse

    monkeypatch.setenv("VL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(openvino_peer, "start_peer", lambda *a, **k: pytest.fail("no peer for float32"))
    args = argparse.Namespace(peer="openvino", openvino_pipeline="cb", quick=True)
    assert concurrency._start_peer(args, "openvino", tmp_path, "float32", 4, tmp_path, {}, lambda: b"") == (None, None)
    assert openvino_peer.LLM_TYPES == {"int8": "int8", "int4": "int4"}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("VL_TEST_OPENVINO") != "1", reason="optional peer: set VL_TEST_OPENVINO=1 "
                    "(makes the tool environment under VL_CACHE_DIR/openvino, about 1.6 GB)")
@pytest.mark.parametrize("pipeline", ["cb", "vlm"])
def test_end_to_end_on_the_tiny_checkpoint(tiny_model_dir, tmp_path, pipeline):
    import base64
    import time

    import requests

    from vlservice.config import Settings
    from vlservice.tools.workloads import encode_jpeg, photo_like

    cache = Settings.from_env().cache_path  # the tool environment is large: made once, where the user's is
    # group 64: the tiny checkpoint's widths (64) are not divisible by 128 (NNCF's InvalidGroupSizeError)
    peer = openvino_peer.start_peer(tiny_model_dir, cache, "int4", 2, 2, tmp_path / "server.log", pipeline=pipeline)
    try:
        peer.wait_ready(timeout=300)
        assert peer.health()["pipeline"] == pipeline
        photos = [encode_jpeg(photo_like(112, 112, seed=s)) for s in range(3)]
        first = concurrency.run_clients(peer.url, [(photos[0], "Describe this image.")], 0, 8, concurrency.PEER_BODY)
        assert first[0]["tokens"] == 8, first
        assert first[0]["timings"]["predicted_n"] >= first[0]["tokens"]
        health = peer.health()
        assert health["first_token_s"] > 0 and health["first_request_s"] >= health["first_token_s"]
        two = concurrency.run_clients(peer.url, [(p, "Describe this image.") for p in photos[1:]], 0.05, 16,
                                      concurrency.PEER_BODY)
        assert all("error" not in r and r["tokens"] == 16 for r in two), two
        # a client that leaves early: its generation is cancelled and the next request is served at once
        body = {"stream": True, "max_tokens": 4000, "min_tokens": 4000, "ignore_eos": True, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,"
                                          + base64.b64encode(photos[0]).decode()}}, {"type": "text", "text": "Hi."}]}]}
        with requests.post(peer.url + "/v1/chat/completions", json=body, stream=True, timeout=60) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i > 10:
                    break
        t = time.perf_counter()
        after = concurrency.run_clients(peer.url, [(photos[1], "Describe this image.")], 0, 8, concurrency.PEER_BODY)
        assert after[0]["tokens"] == 8 and time.perf_counter() - t < 3, after
    finally:
        peer.stop()
    assert "first request (OpenVINO compiles then)" in (tmp_path / "server.log").read_text()


def test_both_peers_in_one_run_are_parsed_in_order(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(concurrency, "_openvino_env", lambda: 0)
    monkeypatch.setattr("vlservice.tools.peer.missing", lambda: "")
    monkeypatch.setattr(concurrency, "start_report", lambda args: (None, None, {}))
    monkeypatch.setattr(concurrency, "measure", lambda args, m, o: (seen.update(peer=args.peer), exit(0)))
    with pytest.raises(SystemExit):
        concurrency.main(["--peer", "openvino,llama.cpp,openvino", "--out", str(tmp_path)])
    assert seen == {"peer": ["openvino", "llama.cpp"]}


def test_the_peer_table_puts_every_server_beside_ours():
    """One row per server: its weights, one stream's first token, rate and answers, the widest
    level's aggregate and longest gap, the peak RSS and the whole server's peak PSS (ours: the
    one-stream server's), each from the report."""
    one = {"prompt_ms": 900.0, "vision_encode_ms": 300.0,
           "ttft_s": 2.5, "decode_tps": 21.2, "answer_64_s": 5.2, "answer_128_s": 8.0, "answer_256_s": 14.1}
    level = {"stream_tps_median": 7.0, "ttft_p50_s": 3.0, "ttft_p95_s": 4.0}
    peer_one = {"prompt_ms": 5000.0, "vision_encode_ms": None,
                "ttft_s": 6.5, "decode_tps": 21.5, "answer_64_s": 9.1, "answer_128_s": 12.0, "answer_256_s": 18.2}
    report = {
        "cpu": {"model": "Some CPU", "flags": ["avx2"], "threads": 2}, "limits": {"bandwidth_gb_s": 20},
        "levels": [1, 4], "tokens": 256, "stagger_s": 0.3, "scenarios": {},
        "runs": {"int4 VL_MAX_BATCH=4": {"llm": "int4", "max_batch": 4,
                                         "levels": {"4": {"aggregate_tps": 27.9, "max_gap_s": 0.5, **level}}},
                 "llama.cpp q4_k_m -np 4": {"llm": "llama.cpp q4_k_m -np 4", "max_batch": 4, "peer_of": "int4",
                                            "levels": {"4": {"aggregate_tps": 18.0, "max_gap_s": 13.4, **level}}}},
        "single": {"int4": one, "llama.cpp q4_k_m -np 4": peer_one},
        "peak_rss_mb": {"int4 VL_MAX_BATCH=4": 3100.0, "llama.cpp q4_k_m -np 4": 2400.0},
        "peak_pss_mb": {"int4 VL_MAX_BATCH=1": 2900.0, "int4 VL_MAX_BATCH=4": 3300.0, "llama.cpp q4_k_m -np 4": 2500.0},
        "peers": {"llama.cpp q4_k_m -np 4": {"kind": "llama.cpp", "peer_of": "int4",
                                             "weights": concurrency._peer_module("llama.cpp").WEIGHTS["int4"]}}}
    table = concurrency.peer_table(report)

    def cells(line: str) -> list:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    assert cells(table[0]) == ["server", "weights", "first token s", "decode tok/s", "64-token answer s",
                               "128-token answer s", "256-token answer s", "4 streams: aggregate tok/s",
                               "4 streams: longest gap s", "peak RSS MB", "peak PSS MB, whole server"]
    assert cells(table[2]) == ["vlservice int4", concurrency.OURS_WEIGHTS["int4"],
                               "2.5", "21.2", "5.2", "8.0", "14.1", "27.9", "0.5", "3100.0", "2900.0"]
    assert cells(table[3])[0] == "llama.cpp q4_k_m -np 4" and cells(table[3])[1].startswith("Q4_K_M LLM")
    assert cells(table[3])[2:] == ["6.5", "21.5", "9.1", "12.0", "18.2", "18.0", "13.4", "2400.0", "2500.0"]
    assert "\n".join(table) in concurrency.markdown(report)


def test_peak_rss_reads_the_servers_largest_process(tmp_path):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(300 << 20); b[::4096] = b'x' * "
                              "len(b[::4096]); print('ready', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        server = concurrency.Server.__new__(concurrency.Server)
        server.proc = child
        assert 300 <= server.peak_rss_mb() < 500
    finally:
        child.stdin.close()
        child.wait(10)
    assert server.peak_rss_mb() is None
