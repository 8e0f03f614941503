#!/usr/bin/env bash
# Regenerate generated/denv_api_client from openapi/denv.yaml.
#   scripts/regen.sh          rewrite generated/denv_api_client
#   scripts/regen.sh --check  regenerate into a temporary folder; fail with a diff if generated/ is stale
set -euo pipefail
cd "$(dirname "$0")/.."

GENERATOR_VERSION=0.29.1
RUFF_VERSION=0.14.5
TOOLS="${DENV_REGEN_TOOLS:-.cache/regen-tools}"

# Pinned tools in a venv of their own, so the output never depends on what else is installed.
if ! "$TOOLS/bin/openapi-python-client" --version 2>/dev/null | grep -q " $GENERATOR_VERSION\$" \
   || ! "$TOOLS/bin/ruff" --version 2>/dev/null | grep -q " $RUFF_VERSION\$"; then
  echo "regen: installing openapi-python-client==$GENERATOR_VERSION and ruff==$RUFF_VERSION into $TOOLS" >&2
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install --quiet "openapi-python-client==$GENERATOR_VERSION" "ruff==$RUFF_VERSION"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
PATH="$PWD/$TOOLS/bin:$PATH" openapi-python-client generate \
  --path openapi/denv.yaml --config openapi/config.yaml \
  --output-path "$out/project" --meta none --fail-on-warning >"$out/log" 2>&1 \
  || { cat "$out/log" >&2; echo "regen: generation failed" >&2; exit 1; }
touch "$out/project/py.typed"

if [[ "${1:-}" == "--check" ]]; then
  if ! diff -ru generated/denv_api_client "$out/project"; then
    echo "regen: generated/denv_api_client is stale: run scripts/regen.sh and commit the result" >&2
    exit 1
  fi
  echo "regen: generated/denv_api_client is up to date"
else
  rm -rf generated/denv_api_client
  mkdir -p generated
  cp -r "$out/project" generated/denv_api_client
  echo "regen: wrote generated/denv_api_client"
fi
