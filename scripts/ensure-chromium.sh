#!/usr/bin/env bash
# Make a headless Chromium available for the console's browser tests (tests/browser):
# Debian's chromium package at /usr/bin/chromium, driven by Playwright from PyPI (Playwright's
# own browser download is not used). Idempotent: when chromium is there it only prints its
# version. Installing needs root and apt (Debian: the chromium package).
#   scripts/ensure-chromium.sh
set -euo pipefail

CHROMIUM="${DENV_CHROMIUM:-/usr/bin/chromium}"

log() { echo "ensure-chromium: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ ! -x "$CHROMIUM" ]]; then
  command -v apt-get >/dev/null \
    || die "no apt-get here: install Chromium with your system's package manager (or set DENV_CHROMIUM to its binary), then re-run"
  [[ $(id -u) -eq 0 ]] || die "installing chromium needs root: run this script as root (or sudo)"
  log "installing chromium (apt-get)"
  # apt runs one at a time: ensure-docker.sh may be installing under `make -j` (same lock).
  apt_lock="${TMPDIR:-/tmp}/denv-apt.lock"
  DEBIAN_FRONTEND=noninteractive flock "$apt_lock" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive flock "$apt_lock" \
    apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
"$CHROMIUM" --version >&2 2>/dev/null || die "$CHROMIUM does not run: reinstall it (apt-get install --reinstall chromium)"
