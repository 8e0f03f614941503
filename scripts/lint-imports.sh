#!/usr/bin/env bash
# The layer rules (import-linter contracts in pyproject.toml), checked on the installed layout.
# denv.openenv's source lives in adapters/openenv and denv_api_client's in generated/ (the
# package-dir mapping in pyproject.toml); import-linter finds a package's modules by walking
# its folder, so it is given a copy laid out as the wheel installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
view=$(mktemp -d)
trap 'rm -rf "$view"' EXIT
cp -r denv "$view/denv"
rm -rf "$view/denv/openenv"
cp -r adapters/openenv "$view/denv/openenv"
cp -r generated/denv_api_client "$view/denv_api_client"
find "$view" -name __pycache__ -prune -exec rm -rf {} +
cp pyproject.toml "$view/"
cd "$view"
PYTHONPATH="$view" "$OLDPWD/.venv/bin/lint-imports" --no-cache
