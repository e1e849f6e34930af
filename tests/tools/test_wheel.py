"""`pip install .` gives a working package: the wheel built from this checkout, installed into a
fresh venv, holds every file of `vlservice/`, imports every module from the installed copy (not the
checkout), declares requirements.txt's pins, and runs the `vlservice` command.

The build runs on a copy of the sources (setuptools writes build/ and *.egg-info beside them), with
`--no-build-isolation --no-index`: nothing is downloaded. The fresh venv sees this venv's packages
(torch and the rest, not reinstalled) through a .pth file placed after its own site-packages, so the
installed vlservice is the one that imports.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

# Modules that are scripts for another interpreter, not imported here: name -> why.
NOT_IMPORTED = {
    "vlservice.tools.openvino_serve": "run by the OpenVINO tool environment's python, which has openvino",
}

IMPORT_ALL = """
import importlib, json, sys
import vlservice
files, errors = {}, {}
for name in json.loads(sys.argv[1]):
    try:
        files[name] = importlib.import_module(name).__file__
    except Exception as exc:
        errors[name] = repr(exc)
print(json.dumps({"package": vlservice.__file__, "files": files, "errors": errors}))
"""


def package_files(folder: Path) -> set[str]:
    """The files under a `vlservice` folder, relative to it, without bytecode."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def module_name(relative: str) -> str:
    parts = ["vlservice", *Path(relative).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def run(argv, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, **kw)
    assert r.returncode == 0, f"{argv} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(wheel path, the copied sources' vlservice/, the venv, its site-packages, a clean env)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "requirements.txt"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "vlservice", src / "vlservice", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", dist, src])
    wheel, = dist.glob("vlservice-*.whl")

    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    purelib = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (purelib / "test-venv-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(PYTHONNOUSERSITE="1", HF_HUB_OFFLINE="1", PIP_NO_INPUT="1")
    run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], env=env, cwd=tmp)
    return wheel, src / "vlservice", venv, purelib, env


def test_wheel_holds_the_package_and_its_data_only(built):
    wheel, src, _, purelib, _ = built
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"vlservice"}, f"more than vlservice/: {sorted(tops)}"
    left_out = package_files(src) - package_files(purelib / "vlservice")
    assert not left_out, (f"files under vlservice/ left out of the wheel: {sorted(left_out)}; add them to "
                          "[tool.setuptools.package-data] in pyproject.toml")
    assert "assets/demo-model/model.safetensors" in package_files(purelib / "vlservice")


def test_wheel_declares_the_pinned_requirements_and_the_command(built):
    wheel = built[0]
    with zipfile.ZipFile(wheel) as zf:
        info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(f"{info}/METADATA").decode()
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
    pins = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    declared = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert declared == pins
    assert "vlservice = vlservice.cli:main" in entry_points


def test_every_module_imports_from_the_installed_copy(built, tmp_path):
    _, src, venv, purelib, env = built
    installed = purelib / "vlservice"
    modules = sorted(module_name(f) for f in package_files(installed) if f.endswith(".py"))
    assert modules == sorted(module_name(f) for f in package_files(src) if f.endswith(".py"))
    wanted = [m for m in modules if m not in NOT_IMPORTED]
    # From an empty folder with PYTHONPATH cleared: the checkout is nowhere on sys.path.
    r = run([venv / "bin" / "python", "-c", IMPORT_ALL, json.dumps(wanted)], env=env, cwd=tmp_path)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert Path(out["package"]).parent == installed
    assert out["errors"] == {}
    outside = {m: f for m, f in out["files"].items() if not Path(f).is_relative_to(installed)}
    assert not outside and len(out["files"]) == len(wanted)


def test_the_vlservice_command_runs(built, tmp_path):
    _, _, venv, purelib, env = built
    command = venv / "bin" / "vlservice"
    r = run([command, "--help"], env=env, cwd=tmp_path)
    assert r.stdout.startswith("usage: vlservice ")
    for name in ("serve", "bench", "chat", "export", "make-test-model", "soak"):
        assert name in r.stdout
    assert "--concurrency" in run([command, "bench", "--help"], env=env, cwd=tmp_path).stdout  # a pass-through
    # Away from a checkout, `serve` says in one line where to run it instead of a Gunicorn traceback.
    r = subprocess.run([command, "serve"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].startswith("error: `serve` runs the server files of a checkout")
    # In the checkout, the installed command finds them in the current directory (-I: the current
    # directory is not on sys.path, as for the console script).
    r = run([venv / "bin" / "python", "-I", "-c", "from vlservice import cli; print(cli.__file__, cli.server_root())"],
            env=env, cwd=ROOT)
    cli_file, root = r.stdout.split()
    assert Path(cli_file).is_relative_to(purelib) and Path(root) == ROOT
