#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine, then run the whole suite.
# Usage: bash tests/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
# Chromium for the page's browser tests; jemalloc and tcmalloc for `bench --levers` (measured
# against glibc's malloc).
if ! command -v chromium >/dev/null 2>&1 || ! ldconfig -p | grep -q libjemalloc.so.2 \
    || ! ldconfig -p | grep -q libtcmalloc_minimal.so.4; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium libjemalloc2 libtcmalloc-minimal4 >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt -r tests/requirements.txt
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
