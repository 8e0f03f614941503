#!/usr/bin/env bash
# Build the wheel and import the three packages from a clean venv (not the source tree).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/uv build --wheel --out-dir "$work/dist" --quiet
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "$work"/dist/denv-*.whl
cd "$work"
"$work/venv/bin/python" -c "import denv, denv.openenv, denv_api_client, denv.cli; print('wheel imports denv, denv.openenv, denv_api_client')"
