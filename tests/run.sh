#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine, lint (ruff) and type-check (mypy,
# the engine, the HTTP routes and the protocol models; ESLint and tsc, the page's modules), then
# run the whole suite; any step that fails fails the run.
# Usage: bash tests/run.sh [--fast] [pytest args]
#   --fast: lint, types and the tests not marked slow (no server, browser or tool runs): run it
#           first on every change; CI runs everything.
# The tests run in VL_TEST_WORKERS processes (pytest-xdist, default 2), a file at a time each (a
# file's servers and exports are made once); VL_TEST_WORKERS=0 runs them in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=()
if [ "${1:-}" = "--fast" ]; then
  shift
  FAST=(-m "not slow")
fi
# Chromium for the page's browser tests, with a CJK font so the Chinese page renders in its
# screenshots; jemalloc and tcmalloc for `bench --levers` (measured against glibc's malloc);
# redis-server and nginx for the replicas' tests (tests/deploy/test_replicas.py); nginx and tini for
# the image's front, started as the image starts it (tests/deploy/test_front.py).
# (`grep` without -q reads all of fc-list: an early exit could SIGPIPE it and, with pipefail,
# reinstall every run.) python3-venv: Debian and Ubuntu ship `python3 -m venv`'s ensurepip apart from
# Python itself, so a fresh machine needs it to make .venv.
VENV_PKG=""
if [ ! -x .venv/bin/python ] && ! python3 -c "import ensurepip" >/dev/null 2>&1; then VENV_PKG=python3-venv; fi
if [ -n "$VENV_PKG" ] || ! command -v chromium >/dev/null 2>&1 || ! ldconfig -p | grep -q libjemalloc.so.2 \
    || ! ldconfig -p | grep -q libtcmalloc_minimal.so.4 || ! fc-list 2>/dev/null | grep -i wqy >/dev/null \
    || ! command -v redis-server >/dev/null 2>&1 || ! command -v nginx >/dev/null 2>&1 \
    || ! command -v tini >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium fonts-wqy-zenhei libjemalloc2 libtcmalloc-minimal4 \
    redis-server nginx tini $VENV_PKG >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
# CPU torch first, as the README's start command installs it (PyPI's torch for Linux is a CUDA
# build); the +cpu build of the pinned version then satisfies requirements.txt's pin.
.venv/bin/pip install -q --disable-pip-version-check "$(grep -m1 '^torch==' requirements.txt)" \
  --extra-index-url https://download.pytorch.org/whl/cpu
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt -r tests/requirements.txt
echo "---- lint: ruff ----"
.venv/bin/ruff check .
echo "---- types: mypy (the engine, the HTTP routes, the protocol models, settings and errors; see [tool.mypy] in pyproject.toml) ----"
.venv/bin/mypy
echo "---- page: ESLint and tsc over static/js (// @ts-check; tests/js) ----"
if command -v npm >/dev/null 2>&1; then
  npm ci --prefix tests/js --no-audit --no-fund --loglevel=error >/dev/null
  npm run --prefix tests/js --silent check
else
  echo "SKIPPED: npm is not installed, so the page's modules are not linted or type-checked" \
    "(apt-get install npm, Node 20.19 or later)"
fi
export HF_HUB_OFFLINE=1
WORKERS=()
if [ "${VL_TEST_WORKERS:-2}" != 0 ]; then
  WORKERS=(-n "${VL_TEST_WORKERS:-2}" --dist loadfile)
  # Two files' servers share the cores: OpenMP's idle threads sleep instead of spinning for the core
  # the other process needs (the servers' own defaults are for a machine they have to themselves).
  export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
fi
exec .venv/bin/python -m pytest ${FAST[@]+"${FAST[@]}"} ${WORKERS[@]+"${WORKERS[@]}"} "$@"
