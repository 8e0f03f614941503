#!/usr/bin/env bash
# Build the wheel and import the three packages from a clean venv (not the source tree).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/uv build --wheel --out-dir "$work/dist" --quiet
python3 -m venv "$work/venv"
whl=$(ls "$work"/dist/denv-*.whl)
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "${whl}[openenv,server]"
cd "$work"
"$work/venv/bin/python" - <<'PY'
import importlib.resources

import denv, denv.cli, denv.openenv, denv.openenv.export, denv.server.app, denv_api_client  # noqa: E401,F401

templates = importlib.resources.files("denv.openenv.export") / "templates"
assert (templates / "Dockerfile.tmpl").is_file(), "export templates are missing from the wheel"
print("wheel imports denv, denv.openenv, denv_api_client (and ships the export templates)")
PY
