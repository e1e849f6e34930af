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
        for name, row in rows.items():
            assert row["total_ms"]["min"] <= row["total_ms"]["median"] <= row["total_ms"]["max"]
            assert row["total_ms"]["median"] > 0 and row["speedup_total"]["median"] > 0
        assert rows["baseline"]["speedup_total"]["median"] == 1.0
        assert rows["onnx-int8 warm"]["vision_encode_ms"]["median"] == 0.0  # a cache hit skips the encoder
        for layer in report["int8_fidelity"][wl].values():
            assert 0.9 <= layer["cosine_min"] <= 1.0
    assert report["limits"]["bandwidth_gb_s"] > 0 and report["limits"]["gemm_gflop_s"] > 0
    assert report["ceilings"]["decode_ceiling_tps"] > 0
    assert (out / "bench.md").read_text().count("| baseline |") == 2
    assert (out / "bench.png").stat().st_size > 1000


def test_bench_extras_compare_float32_and_int8_llm_and_repeats(tmp_path, cache_dir):
    out = tmp_path / "extras"
    env = {**os.environ, "VL_CACHE_DIR": str(cache_dir), "VL_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vlservice", "bench", "--extras", "--quick", "--runs", "1",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "extras.json").read_text())
    assert set(report["llm"]) == {"float32", "int8"} and report["llm"]["int8"]["quantize_s"] > 0
    assert all(r["decode_tps"]["median"] > 0 for r in report["llm"].values())
    assert set(report["repeat"]) == {"photo", "document"}
    assert "INT8 / float32" in (out / "extras.md").read_text()
