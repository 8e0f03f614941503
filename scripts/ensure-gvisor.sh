#!/usr/bin/env bash
# gVisor for `denv serve --isolation gvisor` (and its tests): Debian's runsc package, and the
# runtime denv names registered with the Docker Engine (`denv gvisor install`: daemon.json's
# runtimes, then a reload; runc stays the engine's default). Idempotent.
#   scripts/ensure-gvisor.sh [PYTHON]    (PYTHON: the one with denv installed; .venv's by default)
#
# Forks that resume a checkpoint of their parent's sandbox need a runsc released in 2023 or
# later: Debian 12's own (2022-12-19) cannot save a server whose listening socket is watched by
# epoll. Debian's bookworm-backports has 2024-07-29, so on Debian 12 runsc comes from there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"

log() { echo "ensure-gvisor: $*" >&2; }
die() { log "error: $*"; exit 1; }

release() {  # runsc's release date as a number (0 without runsc)
  { runsc --version 2>/dev/null || true; } | sed -n 's/.*\(20[0-9]\{6\}\).*/\1/p' | head -n 1 \
    | grep . || echo 0
}

if [[ $(release) -lt 20230000 ]]; then
  command -v apt-get >/dev/null \
    || die "no apt-get here: install gVisor's runsc (2023 or later) with your system's package manager, then re-run"
  [[ $(id -u) -eq 0 ]] || die "installing runsc needs root: run this script as root (or sudo)"
  target=()
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  if [[ "$codename" == bookworm ]]; then
    sources=/etc/apt/sources.list.d/denv-bookworm-backports.sources
    if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
      log "adding Debian's bookworm-backports to apt's sources ($sources): runsc 2024-07"
      printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" \
        "Suites: bookworm-backports" "Components: main" \
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" > "$sources"
    fi
    target=(-t bookworm-backports)
  fi
  log "installing runsc (apt-get ${target[*]})"
  # apt runs one at a time: other ensure-* scripts may be installing under `make -j`.
  apt_lock="${TMPDIR:-/tmp}/denv-apt.lock"
  DEBIAN_FRONTEND=noninteractive flock "$apt_lock" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive flock "$apt_lock" \
    apt-get install -y -qq --no-install-recommends "${target[@]}" runsc >/dev/null
  [[ $(release) -ge 20230000 ]] \
    || log "warning: runsc $(release) cannot save servers that use epoll: forks under gvisor boot"
fi
"$PY" -m denv gvisor install >&2
