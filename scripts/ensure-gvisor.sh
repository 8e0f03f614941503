#!/usr/bin/env bash
# gVisor for `denv serve --isolation gvisor` (and its tests): Debian's runsc package, and the
# runtime denv names registered with the Docker Engine (`denv gvisor install`: daemon.json's
# runtimes, then a reload; runc stays the engine's default). Idempotent.
#   scripts/ensure-gvisor.sh [PYTHON]    (PYTHON: the one with denv installed; .venv's by default)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"

log() { echo "ensure-gvisor: $*" >&2; }
die() { log "error: $*"; exit 1; }

if ! command -v runsc >/dev/null; then
  command -v apt-get >/dev/null \
    || die "no apt-get here: install gVisor's runsc with your system's package manager, then re-run"
  [[ $(id -u) -eq 0 ]] || die "installing runsc needs root: run this script as root (or sudo)"
  log "installing runsc (apt-get)"
  # apt runs one at a time: other ensure-* scripts may be installing under `make -j`.
  apt_lock="${TMPDIR:-/tmp}/denv-apt.lock"
  DEBIAN_FRONTEND=noninteractive flock "$apt_lock" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive flock "$apt_lock" \
    apt-get install -y -qq --no-install-recommends runsc >/dev/null
fi
"$PY" -m denv gvisor install >&2
