#!/usr/bin/env bash
# A venv with Harbor (PyPI `harbor`, pinned) under .cache/harbor-venv: the e2e tests lint
# and run exported Harbor tasks with it (`harbor lint`, `harbor trial start`). Harbor needs
# Python >= 3.12: pyenv's 3.12 when present, else a python3.12 on PATH.
# Idempotent: does nothing when the venv already has this version.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.26.0
VENV=.cache/harbor-venv
log() { echo "ensure-harbor: $*" >&2; }

if [[ -x $VENV/bin/harbor ]] \
  && [[ "$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("harbor"))' 2>/dev/null)" == "$VERSION" ]]; then
  exit 0
fi
python=""
for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 "$(command -v python3.12 || true)"; do
  if [[ -n $candidate && -x $candidate ]] && "$candidate" --version >/dev/null 2>&1; then
    python=$candidate
  fi
done
[[ -n $python ]] || { log "error: Harbor needs Python 3.12: install it (pyenv install 3.12)"; exit 1; }
log "creating $VENV with harbor==$VERSION ($python)"
rm -rf "$VENV"
"$python" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "harbor==$VERSION"
HARBOR_TELEMETRY=0 "$VENV/bin/harbor" --version >&2  # no usage report to PostHog
