#!/usr/bin/env bash
# The layer rules (import-linter contracts in pyproject.toml), checked on the installed layout.
# denv.openenv's source lives in adapters/openenv and denv_api_client's in generated/ (the
# package-dir mapping in pyproject.toml); import-linter finds a package's modules by walking
# its folder, so it is given a copy laid out as the wheel installs it.
set -euo pipefail
cd "$(dirname "$0")/.."

# The facade's modules live in denv/client/ (the contracts name the folder); a private module
# at the top of denv (the CLI's) is named in the contracts, so a new one must be placed.
for module in denv/_*.py; do
  name="denv.$(basename "$module" .py)"
  [[ "$name" == denv.__init__ || "$name" == denv.__main__ ]] && continue
  grep -q "\"$name\"" pyproject.toml \
    || { echo "lint-imports: $name is in no layer contract: add it to [tool.importlinter] in pyproject.toml" >&2; exit 1; }
done
view=$(mktemp -d)
trap 'rm -rf "$view"' EXIT
cp -r denv "$view/denv"
rm -rf "$view/denv/openenv"
cp -r adapters/openenv "$view/denv/openenv"
cp -r generated/denv_api_client "$view/denv_api_client"
cp -r bench "$view/bench"
find "$view" -name __pycache__ -prune -exec rm -rf {} +
cp pyproject.toml "$view/"
cd "$view"
PYTHONPATH="$view" "$OLDPWD/.venv/bin/lint-imports" --no-cache
