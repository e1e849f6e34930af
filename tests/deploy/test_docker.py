"""No Docker engine runs here, so the image's recipe is held to the documentation's: the install
steps docs/operations.md (Docker) lists are exactly the Dockerfile's RUN lines, in order, and the
image starts the server with the README's command, behind its own nginx (deploy/front/)."""

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


def test_dockerfile_starts_the_readme_command_behind_nginx_as_non_root_with_a_healthcheck():
    """The image's command is the front's launcher under tini, and the launcher starts Gunicorn with
    the README's start command (tests/deploy/test_front.py runs that launcher)."""
    import importlib.util

    docker = (ROOT / "Dockerfile").read_text()
    start = marked_block("start-command")[-1].split("&&")[-1].strip().replace(".venv/bin/", "")
    exec_form = {k: [part.strip().strip('"') for part in v.split(",")]
                 for k, v in re.findall(r'^(CMD|ENTRYPOINT) \[(.*)\]$', docker, re.M)}
    assert exec_form == {"ENTRYPOINT": ["tini", "--"], "CMD": ["python", "deploy/front/launch.py"]}
    spec = importlib.util.spec_from_file_location("launch", ROOT / "deploy" / "front" / "launch.py")
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    assert " ".join(["gunicorn", *launch.GUNICORN_ARGS]) == start
    assert re.search(r"apt-get install -y --no-install-recommends nginx tini", docker)
    for folder in ("deploy/front", "deploy/nginx/edge"):
        assert re.search(rf"^COPY {folder} {folder}$", docker, re.M), folder
    assert "VL_BIND" not in docker  # the launcher binds Gunicorn to its socket; nginx takes :8000
    assert re.search(r"^\s*FRONT_LISTEN=8000", docker, re.M) and re.search(r"^EXPOSE 8000$", docker, re.M)
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
