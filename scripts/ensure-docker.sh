#!/usr/bin/env bash
# Make a Docker Engine answer on this machine, installing and starting it when needed.
#   scripts/ensure-docker.sh             docker CLI + a running dockerd
#   scripts/ensure-docker.sh --mmdebstrap  also mmdebstrap (scripts/base-image.sh needs it offline)
# Idempotent: when everything is already there it runs `docker info` once and exits.
# Installing needs root and apt (Debian/Ubuntu: the docker.io package).
set -euo pipefail

DOCKERD_LOG="${DENV_DOCKERD_LOG:-/var/log/dockerd.log}"
WAIT_S="${DENV_DOCKERD_WAIT_S:-60}"
LOCK_DIR="${TMPDIR:-/tmp}"
APT_LOCK="$LOCK_DIR/denv-apt.lock"

log() { echo "ensure-docker: $*" >&2; }
die() { log "error: $*"; exit 1; }

apt_install() {
  command -v apt-get >/dev/null \
    || die "no apt-get here: install $* with your system's package manager, then re-run"
  [[ $(id -u) -eq 0 ]] || die "installing $* needs root: run this script as root (or sudo)"
  log "installing $* (apt-get)"
  # Refresh the package lists at most once per run. apt runs one at a time: under `make -j`
  # another script may be installing too (ensure-chromium.sh takes the same lock).
  if [[ -z "${_APT_UPDATED:-}" ]]; then
    DEBIAN_FRONTEND=noninteractive flock "$APT_LOCK" apt-get update -qq
    _APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive flock "$APT_LOCK" \
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

want_mmdebstrap=0
for arg in "$@"; do
  case "$arg" in
    --mmdebstrap) want_mmdebstrap=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done

# One run at a time: `make -j` runs this for the docker target and for the base image at
# once, and on a fresh machine two runs would both install docker.io and start dockerd.
# The second waits here, then finds both done.
exec 9>"$LOCK_DIR/denv-ensure-docker.lock"
flock 9

if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
  apt_install docker.io
fi
if [[ $want_mmdebstrap -eq 1 ]] && ! command -v mmdebstrap >/dev/null; then
  apt_install mmdebstrap
fi

if docker info >/dev/null 2>&1; then
  exit 0
fi

started_pid=""
if pgrep -x dockerd >/dev/null; then
  log "dockerd is running but not answering yet; waiting up to ${WAIT_S}s"
else
  [[ $(id -u) -eq 0 ]] || die "dockerd is not running and starting it needs root: run as root, or start the Docker service"
  log "starting dockerd (log: $DOCKERD_LOG)"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  # setsid: dockerd must outlive this script and the make/CI step that ran it.
  # 9>&-: the lock above is this run's, not dockerd's (it would hold it for its lifetime).
  setsid dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null 9>&- &
  started_pid=$!  # setsid execs dockerd in this process (no fork: we are not a group leader)
fi

dockerd_alive() {
  if [[ -n "$started_pid" ]]; then kill -0 "$started_pid" 2>/dev/null; else pgrep -x dockerd >/dev/null; fi
}

deadline=$((SECONDS + WAIT_S))
until docker info >/dev/null 2>&1; do
  if (( SECONDS >= deadline )); then
    log "error: dockerd did not answer within ${WAIT_S}s; last lines of $DOCKERD_LOG:"
    tail -n 30 "$DOCKERD_LOG" >&2 2>/dev/null || true
    die "fix what the log says (storage driver, iptables, permissions), or raise DENV_DOCKERD_WAIT_S"
  fi
  if ! dockerd_alive; then
    log "error: dockerd exited; last lines of $DOCKERD_LOG:"
    tail -n 30 "$DOCKERD_LOG" >&2 2>/dev/null || true
    die "dockerd could not start: fix what the log says, then re-run"
  fi
  sleep 0.5
done
log "dockerd is answering"
