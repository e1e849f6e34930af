"""`python -m vlservice.tools.memory --pod`: the server in a memory cgroup of its own, what the
kernel charges it per phase, and whether it lives under a given limit (the Kubernetes manifests'
numbers come from this tool on the real-size checkpoint)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlservice.tools.memory import Cgroup

ROOT = Path(__file__).resolve().parents[2]


def _cgroups_writable() -> bool:
    try:
        Cgroup(f"vlservice-probe-{os.getpid()}", None).remove()
        return True
    except OSError:
        return False


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not _cgroups_writable(), reason="needs a writable memory cgroup (root)")]


def _pod(tmp_path, tiny_model_dir, cache_dir, limit_mib):
    out = tmp_path / f"pod-{limit_mib}.json"
    env = {**os.environ, "VL_MODEL": str(tiny_model_dir), "VL_CACHE_DIR": str(cache_dir), "HF_HUB_OFFLINE": "1",
           "VL_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-m", "vlservice.tools.memory", "--pod", "--limit-mib", str(limit_mib),
                           "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return proc, json.loads(out.read_text())


def test_pod_peaks_per_phase_under_a_roomy_limit(tmp_path, tiny_model_dir, cache_dir):
    proc, report = _pod(tmp_path, tiny_model_dir, cache_dir, 4096)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["loaded"] and report["answered"] == report["asked"] == 8 and report["oom_kills"] == 0
    for phase in ("loading", "serving"):
        row = report["phases"][phase]
        assert 50 < row["anon_mib"] <= row["working_set_mib"] + 1 <= row["usage_mib"] + 1 < 4096
    assert report["cpu"]["model"] and report["date"] and "--pod" in report["command"]


def test_pod_under_too_small_a_limit_is_reported_as_failed(tmp_path, tiny_model_dir, cache_dir):
    proc, report = _pod(tmp_path, tiny_model_dir, cache_dir, 120)
    assert proc.returncode == 1
    assert report["oom_kills"] > 0 and not (report["loaded"] and report["answered"] == report["asked"])
