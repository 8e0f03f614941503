#!/usr/bin/env bash
# Create .venv with every extra and the dev tools, exactly as uv.lock pins them.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/uv ]]; then
  echo "bootstrap: creating .venv" >&2
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check uv
fi
.venv/bin/uv sync --locked --all-extras --group dev --quiet
