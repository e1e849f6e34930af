"""`python -m vlservice bench --quick`: the benchmark's code path end to end on a tiny checkpoint.
It checks the output's shape and sanity, not the timings (speed is the benchmark's job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def cells(md: str) -> list[list[str]]:
    """The rows of the Markdown tables in `md`, each as its cells without the padding."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines() if line.startswith("|")]


def count_cell(md: str, text: str) -> int:
    return sum(row.count(text) for row in cells(md))


def test_bench_quick_writes_json_markdown_and_chart(tmp_path, cache_dir):
    out = tmp_path / "bench"
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "VL_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--quick", "--runs", "1", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    variants = {"baseline", "torch", "onnx-fp32", "onnx-int8 cold", "onnx-int8 warm", "onnx-int8 repeat",
                "onnx-int8 follow-up"}
    for wl in ("photo", "document"):
        rows = report["summary"][wl]
        assert set(rows) == variants
        for _name, row in rows.items():
            assert row["total_ms"]["min"] <= row["total_ms"]["median"] <= row["total_ms"]["max"]
            assert row["total_ms"]["median"] > 0 and row["speedup_total"]["median"] > 0
        assert rows["baseline"]["speedup_total"]["median"] == 1.0
        assert rows["onnx-int8 warm"]["vision_encode_ms"]["median"] == 0.0  # a cache hit skips the encoder
        for layer in report["int8_fidelity"][wl].values():
            assert 0.9 <= layer["cosine_min"] <= 1.0
    assert report["limits"]["bandwidth_gb_s"] > 0 and report["limits"]["gemm_gflop_s"] > 0
    assert report["ceilings"]["decode_ceiling_tps"] > 0
    assert count_cell((out / "bench.md").read_text(), "baseline") == 2
    assert (out / "bench.png").stat().st_size > 1000


def quick_bench(mode: str, out, cache_dir) -> None:
    """`python -m vlservice bench <mode> --quick --runs 1` on the tiny checkpoint; must succeed."""
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "VL_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", mode, "--quick", "--runs", "1",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_bench_extras_compare_float32_and_int8_llm_and_repeats(tmp_path, cache_dir):
    out = tmp_path / "extras"
    quick_bench("--extras", out, cache_dir)
    report = json.loads((out / "extras.json").read_text())
    assert set(report["llm"]) == {"float32", "int8"}
    for row in report["llm"].values():
        for wl in ("photo", "document"):
            assert row[wl]["decode_tps"]["median"] > 0 and row[wl]["follow_up_ttft_ms"]["median"] > 0
            # the follow-up reuses the first turn's KV cache: at least its whole prompt
            assert row[wl]["follow_up_cache_n"] >= row[wl]["prompt_n"] and row[wl]["follow_up_prompt_n"] > 0
    assert set(report["repeat"]) == {"photo", "document"}
    assert "INT8 / float32" in (out / "extras.md").read_text()


def test_bench_levers_measures_each_setting_in_its_own_process(tmp_path, cache_dir):
    out = tmp_path / "levers"
    quick_bench("--levers", out, cache_dir)
    report = json.loads((out / "levers.json").read_text())
    summary = report["summary"]
    assert {"default", "threads=1", "OMP bound to cores", "MALLOC_ARENA_MAX=2"} <= set(summary)
    assert set(summary) | set(report["missing"]) >= {"jemalloc", "tcmalloc"}
    for r in summary.values():
        assert r["n"] == 1 and r["decode_tps"] > 0 and r["peak_rss_mib"] > 0  # --quick: one run, one pass
    g = report["grayscale"]
    assert g["colour"]["tokens"] == g["grayscale"]["tokens"] and g["grayscale"]["bytes"] < g["colour"]["bytes"]
    assert "answer vs default" in (out / "levers.md").read_text()


def test_bench_concurrency_quick_runs_clients_through_the_real_server(tmp_path, cache_dir):
    """`bench --concurrency`: N streaming clients against Gunicorn, VL_MAX_BATCH=1 beside batching,
    every level answered, the CPU named, JSON/Markdown/chart written."""
    out = tmp_path / "conc"
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "VL_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--concurrency", "1,3", "--quick", "--llm",
                           "float32", "--tokens", "8", "--stagger", "0.05", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "concurrency.json").read_text())
    assert report["cpu"]["model"] and report["cpu"]["threads"] == 2 and report["limits"]["bandwidth_gb_s"] > 0
    assert set(report["runs"]) == {"float32 VL_MAX_BATCH=1", "float32 VL_MAX_BATCH=3"}
    for run in report["runs"].values():
        for n, row in run["levels"].items():
            assert row["ok"] == int(n) and not row["errors"]
            assert row["aggregate_tps"] > 0 and row["ttft_p50_s"] <= row["ttft_p95_s"]
    scenario = report["scenarios"]["float32"]
    assert scenario["lone_ttft_s"] > 0 and scenario["stream_max_gap_during_doc_s"] is not None
    assert scenario["choices_n"] == 3 and scenario["choices_answer_s"] > 0 and scenario["choices_ratio"] > 0
    single = report["single"]
    assert set(single) == {"float32 plain", "float32 prepacked"}
    for row in single.values():
        assert row["runs"] == 3 and row["decode_tps"] > 0 and row["prompt_ms"] > 0
    md = (out / "concurrency.md").read_text()
    assert report["cpu"]["model"] in md and count_cell(md, "float32") == 6
    assert count_cell(md, "float32 plain") and count_cell(md, "float32 prepacked")
    assert (out / "concurrency.png").stat().st_size > 1000


def test_bench_peer_says_what_it_lacks_and_exits_2(tmp_path):
    """`--peer llama.cpp` builds llama.cpp; without cmake it says what to install, before any work."""
    env = {**os.environ, "PATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}  # no cmake, no compiler
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--concurrency", "1", "--peer", "llama.cpp",
                           "--out", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "cmake" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_bench_decode_quick_splits_a_step_and_names_its_floor(tmp_path, cache_dir):
    """`bench --decode`: per LLM and batch size, the kernels alone, attention, the rest of the lean
    step, and the scheduler's own cycle through the service; the floor's share of the service."""
    out = tmp_path / "decode"
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "VL_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--decode", "--quick", "--llm", "float32,int8,int4",
                           "--batches", "1,2", "--reps", "3", "--tokens", "40", "--parity-tokens", "8", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "decode.json").read_text())
    assert report["cpu"]["model"] and report["limits"]["bandwidth_gb_s"] > 0
    assert report["date"] and report["command"].startswith("python -m vlservice bench --decode")
    assert set(report["llms"]) == {"float32", "int8", "int4"}
    assert report["llms"]["int4"]["batches"]["1"]["profiled_ops_ms"] > 0  # ONNX Runtime's own profile was read
    assert report["llms"]["int4"]["parity"]["tokens"] == 8  # compared with float32 (agreement reported, not asserted)
    for result in report["llms"].values():
        rows = result["batches"]
        assert set(rows) == {"1", "2"}
        for row in rows.values():
            assert row["kernels_ms"] > 0 and row["lean_step_ms"] > 0 and row["attention_ms"] > 0
            service = row["service"]
            assert service["cycles"] > 0 and service["forward_ms"] <= service["step_ms"] and service["cycle_ms"] > 0
            assert row["floor_share"] > 0  # on a tiny model the ratio says nothing; on the real one it is the point
    # the fused INT8 products give the same bits as seven separate ones
    assert report["llms"]["int8"]["parity"]["bitwise_equal"] and report["llms"]["int8"]["parity"]["identical_tokens"] == 8
    assert report["llms"]["float32"]["parity"]["logits_max_rel_diff"] < 1e-4
    md = (out / "decode.md").read_text()
    assert report["cpu"]["model"] in md and count_cell(md, "int8") == 3  # two batch sizes and the parity row


def test_bench_replicas_quick_measures_affinity_and_redis_through_nginx(tmp_path, cache_dir):
    """`bench --replicas`: two real replicas behind the shipped nginx template, without and with a
    real Redis. The tool itself checks that every request landed where its session hashes to; what
    the replicas report must show why the numbers differ: the follow-up on its own replica comes from
    its KV cache and on the other is computed whole, and a second question about a photo on the other
    replica encodes it only without Redis. (Times are not compared here: on a tiny checkpoint a whole
    conversation prefills as fast as a follow-up's few tokens.)"""
    out = tmp_path / "replicas"
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "VL_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--replicas", "--quick", "--runs", "1",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "replicas.json").read_text())
    assert report["cpu"]["model"] and report["limits"]["bandwidth_gb_s"] > 0
    for label, cfg in report["configs"].items():
        assert cfg["follow_up_own"]["cache_n"] > 0, label
        assert cfg["follow_up_other"]["cache_n"] == 0, label
        assert all(row["ttft_s"] > 0 for row in cfg.values()), label
    assert report["configs"]["no-redis"]["second_question_other"]["vision_encode_ms"] > 0
    assert report["configs"]["redis"]["second_question_other"]["vision_encode_ms"] == 0
    md = (out / "replicas.md").read_text()
    assert report["cpu"]["model"] in md and count_cell(md, "yes") == count_cell(md, "no") == 4


def test_bench_video_quick_times_each_stage_at_two_budgets(tmp_path, cache_dir):
    """`bench --video`: a drawn 10-second clip through the service at the default per-frame budget
    and at 224 x 224 px: 20 frames sampled at 2 fps either way, fewer video tokens at the lower
    budget, every stage timed, the CPU named."""
    out = tmp_path / "video"
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "VL_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--video", "--quick", "--runs", "1",
                           "--tokens", "4", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "video.json").read_text())
    assert report["cpu"]["model"] and report["clip"]["seconds"] == 10 and report["clip"]["bytes"] > 0
    auto, low = report["budgets"]["auto"], report["budgets"]["low"]
    assert auto["video_frames"] == low["video_frames"] == 20
    assert low["frame_pixels"] == 224 * 224 < auto["frame_pixels"]
    assert 0 < low["video_tokens"] < auto["video_tokens"] < auto["prompt_tokens"]
    for row in (auto, low):
        assert all(row[k] > 0 for k in ("video_decode_ms", "video_preprocess_ms", "vision_encode_ms", "prompt_ms",
                                        "decode_tps"))
        assert row["ttft_ms"] >= row["vision_encode_ms"]
    md = (out / "video.md").read_text()
    assert report["cpu"]["model"] in md and "224 x 224 (50,176 px)" in md
    assert any(row[1:3] == ["20", "2,200"] for row in cells(md))


def test_bench_lowbit_quick_times_every_weight_kernel_beside_the_shipped_one(tmp_path, cache_dir):
    """`bench --lowbit`: one decode step's products in each 8- and 4-bit format available here,
    the shipped row-scaled INT8 first and measured; a kernel this machine lacks is reported, not
    fatal; the CPU named."""
    from vlservice.tools.lowbit import CANDIDATES

    out = tmp_path / "lowbit"
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "VL_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--lowbit", "--quick", "--reps", "2",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "lowbit.json").read_text())
    assert list(report["steps"]) == list(CANDIDATES) and report["products"] == 4 * report["layers"] + 1
    shipped = report["steps"]["fbgemm int8, row-scaled (shipped)"]
    assert shipped["1"] > 0 and shipped["4"] > 0
    assert report["steps"]["ORT MatMulNBits 4-bit"]["1"] > 0  # onnxruntime is a core package
    for row in report["steps"].values():
        assert "error" in row or (row["1"] > 0 and row["4"] > 0)
    md = (out / "lowbit.md").read_text()
    assert report["cpu"]["model"] in md and md.count("\n| ") == len(CANDIDATES) + 1


def test_bench_constraints_quick_times_compile_mask_and_the_step_share(tmp_path, cache_dir):
    """`bench --constraints`: grammar compile times cold and cached, the mask per token on a row of
    the real vocabulary along a valid answer (a refused valid token fails the run), and the masks'
    share of the scheduler's step at batch 1 and 2, constrained beside unconstrained."""
    out = tmp_path / "constraints"
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "VL_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--constraints", "--quick", "--batches", "1,2",
                           "--tokens", "12", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "constraints.json").read_text())
    assert report["cpu"]["model"] and report["command"].startswith("python -m vlservice bench --constraints")
    c = report["results"]["compile"]
    assert c["vocab"] > 150_000  # the real Qwen vocabulary, even on the tiny checkpoint
    assert set(c["grammars"]) == {"receipt", "shape list", "two tools, required"}
    assert all(g["compile_ms"] > 0 and g["cached_ms"] >= 0 for g in c["grammars"].values())
    assert c["mask"]["tokens"] > 20 and c["mask"]["median_ms"] > 0
    for row in report["results"]["batches"].values():
        assert row["plain"]["cycles"] > 0 and row["constrained"]["cycles"] > 0
        assert row["plain"]["mask_ms_per_step"] == 0 and row["constrained"]["mask_ms_per_step"] > 0
        assert row["mask_share_of_step"] > 0
    assert set(report["results"]["batches"]) == {"1", "2"}
    assert "share of the step" in (out / "constraints.md").read_text()


def test_bench_structured_runs_the_openai_helpers_through_the_server(tmp_path, cache_dir):
    """`bench --structured N`: the openai client's parse helper and a forced tool call on pictures the
    demo model never saw, through Gunicorn; every finished answer valid (else exit 1)."""
    out = tmp_path / "structured"
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--structured", "1", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "structured.json").read_text())
    assert report["cpu"]["model"] and report["command"].startswith("python -m vlservice bench --structured")
    for row in report["results"].values():
        assert row["requests"] == 1 and row["valid_of_finished"] == row["finished"]
        assert row["finished"] + row["cut_by_max_tokens"] == 1
    plain = report["results"]["parse, plain schema (shape, colour, count)"]
    assert plain["correct"] in (0, 1) and plain["correct"] <= plain["valid"]
    assert "correct" in (out / "structured.md").read_text()


def test_a_plain_answer_is_right_only_when_the_picture_says_so():
    from vlservice.tools.structured import Plain, images, right

    drawn = (("circle", "red", 10, 10, 5), ("square", "blue", 30, 10, 5))
    assert right(Plain(shape="Circle", color="red ", count=2), drawn)
    assert not right(Plain(shape="circle", color="blue", count=2), drawn)  # no blue circle was drawn
    assert not right(Plain(shape="square", color="blue", count=1), drawn)
    pictures = images(3, shapes_only=True)
    assert len(pictures) == 3 and all(objects for _, objects in pictures)


def test_bench_prefill_quick_times_a_photo_prompt_in_both_runners(tmp_path, cache_dir):
    """`bench --prefill`: one image-shaped prompt through the int4 graph and the INT8 LLM, the CPU
    and the command named, JSON and Markdown written."""
    out = tmp_path / "prefill"
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "VL_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--prefill", "--quick", "--tokens", "40",
                           "--reps", "1", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "prefill.json").read_text())
    assert report["cpu"]["model"] and report["command"].startswith("python -m vlservice bench --prefill")
    assert len(report["prefill_s"]) == 2 and all(s > 0 for s in report["prefill_s"].values())
    md = (out / "prefill.md").read_text()
    assert all(name in md for name in report["prefill_s"]) and report["cpu"]["model"] in md
    assert len(report["kernels"]) == 5 and all(set(g) == {"1", "40"} and min(g.values()) > 0
                                               for g in report["kernels"].values())
    assert all(name in md for name in report["kernels"])
