"""`train-demo` never replaces the shipped demo model unless asked to, and never trains on the
held-out images: the refusals exit 2 with one line, before any training (so these runs are quick)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def bundled() -> Path:
    from vlservice.engine.model.checkpoints import bundled_demo_path

    return bundled_demo_path()


def snapshot(directory: Path) -> dict:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


def train_demo(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "vlservice", "train-demo", *map(str, args)], check=False, cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_out_is_required():
    r = train_demo("--steps", "1")
    assert r.returncode == 2
    assert "--out" in r.stderr


@pytest.mark.parametrize("args", [
    lambda tmp: ["--out", bundled()],
    lambda tmp: ["--init", bundled(), "--out", bundled()],
    lambda tmp: ["--out", bundled() / "sub"],  # inside the package's model directory
    lambda tmp: ["--out", tmp / "link"],  # a symlink to it
], ids=["out", "init-and-out", "inside", "symlink"])
def test_writing_the_bundled_model_needs_the_flag(tmp_path, args):
    (tmp_path / "link").symlink_to(bundled(), target_is_directory=True)
    before = snapshot(bundled())
    r = train_demo(*args(tmp_path), "--steps", "1")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "--overwrite-bundled" in lines[0], r.stderr
    assert snapshot(bundled()) == before
    assert not (bundled() / "sub").exists()


@pytest.mark.parametrize("seed", ["999", "7919"])
def test_held_out_seeds_are_refused(tmp_path, seed):
    r = train_demo("--out", tmp_path / "out", "--seed", seed, "--steps", "1")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--seed {seed}" in lines[0], r.stderr
    assert not (tmp_path / "out").exists()


def test_what_is_allowed(tmp_path):
    from vlservice.demo.evaluate import DEV_SEED, REPORT_SEED
    from vlservice.demo.train import refusal

    assert refusal(tmp_path / "out", 0, overwrite_bundled=False) is None
    assert refusal(bundled(), 0, overwrite_bundled=True) is None  # asked for explicitly
    assert refusal(bundled(), REPORT_SEED, overwrite_bundled=True) is not None  # the flag does not allow this
    assert refusal(tmp_path / "out", DEV_SEED, overwrite_bundled=False) is not None
