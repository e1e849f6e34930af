"""No Docker engine runs here, so the image's recipe is held to the documentation's: the install
steps docs/operations.md (Docker) lists are exactly the Dockerfile's RUN lines, in order, and the
image starts the server with the README's command."""

from __future__ import annotations

import re

from conftest import ROOT


def marked_block(marker: str, page: str = "README.md") -> list[str]:
    text = (ROOT / page).read_text()
    m = re.search(rf"<!-- {marker} -->\s*```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert m, f"{page} has no block marked <!-- {marker} -->"
    return [line.strip() for line in m.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_dockerfile_installs_exactly_the_documented_steps():
    steps = marked_block("install-steps", "docs/operations.md")
    runs = [line[4:].strip() for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("RUN pip ")]
    assert runs == [s.replace(".venv/bin/pip", "pip") for s in steps if "pip install" in s]


def test_dockerfile_starts_the_readme_command_as_non_root_with_a_healthcheck():
    docker = (ROOT / "Dockerfile").read_text()
    start = marked_block("start-command")[-1].split("&&")[-1].strip().replace(".venv/bin/", "")
    cmd = re.search(r'^CMD \[(.*)\]$', docker, re.M).group(1)
    assert " ".join(part.strip().strip('"') for part in cmd.split(",")) == start
    assert re.search(r"^USER (?!root)\S+", docker, re.M)
    assert "HEALTHCHECK" in docker and "/healthz" in docker
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text()


def test_readme_quick_start_matches_ci():
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = marked_block("test-command")[-1]
    assert test_cmd in ci
    assert (ROOT / ".dockerignore").is_file() and (ROOT / "compose.yaml").is_file()


def test_the_start_command_installs_the_images_cpu_torch():
    """The quick start and the image take torch from the same CPU wheel index (PyPI's default Linux
    wheel is a CUDA build)."""
    index = re.search(r"^ENV PIP_EXTRA_INDEX_URL=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M).group(1)
    assert f"pip install torch==2.13.0 --extra-index-url {index} " in " ".join(marked_block("start-command"))
