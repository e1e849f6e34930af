"""No Docker engine runs here, so the image's recipe is held to the README's: the install steps
the README tells people to run are exactly the Dockerfile's RUN lines, in order, and the image
starts the server with the README's command."""

from __future__ import annotations

import re

from conftest import ROOT


def readme_block(marker: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"<!-- {marker} -->\s*```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert m, f"README has no block marked <!-- {marker} -->"
    return [line.strip() for line in m.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_dockerfile_installs_exactly_the_readme_steps():
    steps = readme_block("install-steps")
    runs = [line[4:].strip() for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("RUN pip ")]
    assert runs == [s.replace(".venv/bin/pip", "pip") for s in steps if "pip install" in s]


def test_dockerfile_starts_the_readme_command_as_non_root_with_a_healthcheck():
    docker = (ROOT / "Dockerfile").read_text()
    start = readme_block("start-command")[-1].split("&&")[-1].strip().replace(".venv/bin/", "")
    cmd = re.search(r'^CMD \[(.*)\]$', docker, re.M).group(1)
    assert " ".join(part.strip().strip('"') for part in cmd.split(",")) == start
    assert re.search(r"^USER (?!root)\S+", docker, re.M)
    assert "HEALTHCHECK" in docker and "/healthz" in docker
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text()


def test_readme_quick_start_matches_ci():
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = readme_block("test-command")[-1]
    assert test_cmd in ci
    assert (ROOT / ".dockerignore").is_file() and (ROOT / "compose.yaml").is_file()
