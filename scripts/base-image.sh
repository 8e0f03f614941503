#!/usr/bin/env bash
# Build the Python base image every denv image builds FROM: denv-python-base:3.11.
#   scripts/base-image.sh          build it unless it already exists
#   scripts/base-image.sh --force  rebuild it
# With a registry, it is python:3.11-slim re-tagged. Without one (this is the point),
# it is Debian bookworm's python3 (3.11) from mmdebstrap, imported with `docker import`:
# python3, python3-venv, python3-pip and ca-certificates, apt configured, about 40 s.
# Dockerfiles must not assume which one they got: they make a venv with `python3 -m venv`.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${DENV_BASE_IMAGE:-denv-python-base:3.11}"
UPSTREAM="python:3.11-slim"
SUITE=bookworm
PULL_TIMEOUT_S="${DENV_PULL_TIMEOUT_S:-60}"

log() { echo "base-image: $*" >&2; }
die() { log "error: $*"; exit 1; }

force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
  *) die "unknown argument '$1' (see --help)" ;;
esac

scripts/ensure-docker.sh

if [[ $force -eq 0 ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "$IMAGE exists ($(docker image inspect -f '{{.Id}}' "$IMAGE" | cut -c8-19))"
  exit 0
fi

# A registry that is down fails in well under a second (DNS); one that is slow gets a bound.
log "trying: docker pull $UPSTREAM (up to ${PULL_TIMEOUT_S}s)"
if timeout "$PULL_TIMEOUT_S" docker pull -q "$UPSTREAM" >/dev/null 2>&1; then
  docker tag "$UPSTREAM" "$IMAGE"
  log "$IMAGE = $UPSTREAM (pulled)"
  exit 0
fi
log "no registry reachable: building $IMAGE offline from Debian $SUITE packages (mmdebstrap)"

scripts/ensure-docker.sh --mmdebstrap

start=$SECONDS
tarball=$(mktemp --suffix=.tar)
trap 'rm -f "$tarball"' EXIT
# --variant=apt: essential + apt only, then our packages; the docs/man/locale
# filters keep the image near python:3.11-slim's size.
mmdebstrap --variant=apt --mode=root --format=tar \
  --include=python3,python3-venv,python3-pip,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --aptopt='APT::Install-Recommends "false"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  "$SUITE" "$tarball" 2>&1 | sed -u 's/^/base-image: mmdebstrap: /' >&2
log "rootfs ready ($((SECONDS - start))s, $(du -h "$tarball" | cut -f1)); importing"

docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' \
  --message "denv offline base: Debian $SUITE python3 (mmdebstrap)" \
  "$tarball" "$IMAGE" >/dev/null
log "$IMAGE built offline in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$IMAGE" | numfmt --to=iec))"
