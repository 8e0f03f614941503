#!/usr/bin/env bash
# Build denv-openenv-template:latest: the env OpenEnv's own `openenv init` generates (its echo
# env template), built by the Dockerfile it generates, unmodified, only when its inputs changed.
#   images/openenv-template.sh [--force] [--no-cache]
# 1. `openenv init` from .venv writes the env into a temporary folder; with uv on its PATH it
#    also locks the env (uv.lock), here with PyPI as of this project's uv.lock (UV_EXCLUDE_NEWER),
#    so the image runs the OpenEnv release that generated it, and the same versions each build.
# 2. Its server/Dockerfile is built with BASE_IMAGE=denv-openenv-base:latest (the local
#    stand-in for ghcr.io/huggingface/openenv-base, images/openenv-base) and the build args
#    `openenv build` would pass. The Dockerfile uses BuildKit (RUN --mount=type=cache), which
#    this Docker CLI only runs through buildx: the build goes through `docker compose build`
#    (Compose v2, `make compose`), which carries a BuildKit client of its own.
# Up to date = the stamp .cache/images/denv-openenv-template_latest.stamp and the image's label
# ai.denv.inputs both equal the hash of: the installed openenv version, uv's version, uv.lock,
# this script and the base image id. Nothing OpenEnv generates is kept in the repo.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=denv-openenv-template:latest
BASE_IMAGE="${DENV_OPENENV_BASE_IMAGE:-denv-openenv-base:latest}"
ENV_NAME=denv_template
STAMPS=.cache/images
LOG_TAG=openenv-template

log() { echo "images: $*" >&2; }
die() { log "error: $*"; exit 1; }

force=0 no_cache=()
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --no-cache) force=1; no_cache=(--no-cache) ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done

[[ -x .venv/bin/openenv && -x .venv/bin/uv ]] \
  || die "no .venv/bin/openenv or .venv/bin/uv: run scripts/bootstrap.sh (or make images)"
docker compose version 2>/dev/null | grep -Eq 'version v?2\.' \
  || die "the build needs BuildKit through Docker Compose v2: run scripts/ensure-compose.sh (make compose)"
base_id=$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE" 2>/dev/null) \
  || die "base image $BASE_IMAGE is missing: run make image-openenv-base"
openenv_version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("openenv"))') \
  || die "openenv is not installed in .venv: run scripts/bootstrap.sh"

hash=$({
  echo "base $base_id"
  echo "openenv $openenv_version"
  .venv/bin/uv --version
  sha256sum uv.lock images/openenv-template.sh
} | sha256sum | cut -c1-16)

stamp="$STAMPS/${NAME//[:\/]/_}.stamp"
# One build of this image at a time on a shared machine; the second finds it up to date.
mkdir -p "$STAMPS"
exec 9>"${stamp%.stamp}.lock"
if ! flock -n 9; then
  log "waiting for another build of $NAME"
  flock 9
fi
if [[ $force -eq 0 && -f "$stamp" && "$(cat "$stamp")" == "$hash" ]] \
   && [[ "$(docker image inspect -f '{{index .Config.Labels "ai.denv.inputs"}}' "$NAME" 2>/dev/null)" == "$hash" ]]; then
  log "$NAME is up to date ($hash)"
  exit 0
fi

start=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Pins: uv resolves the env as of the newest upload in this project's uv.lock (exclude-newer,
# which the env's uv.lock records), so every build gets the same versions, close to this
# project's. Exact pins would need the env's pyproject edited: `uv lock` takes no constraints
# file, and ignores constraint-dependencies from a uv.toml.
pins_date=$(.venv/bin/python -c '
import datetime, re
stamps = re.findall(r"upload-time = \"([^\"]+)\"", open("uv.lock").read())
newest = max(datetime.datetime.fromisoformat(s.replace("Z", "+00:00")) for s in stamps)
print((newest + datetime.timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ"))
') || die "cannot read upload times from uv.lock"

log "generating the env with openenv $openenv_version: openenv init $ENV_NAME (and uv lock, PyPI as of $pins_date)"
mkdir "$work/out"
venv_bin="$PWD/.venv/bin"
if ! (cd "$work/out" && PATH="$venv_bin:$PATH" UV_EXCLUDE_NEWER="$pins_date" \
      "$venv_bin/openenv" init "$ENV_NAME") >"$work/init.log" 2>&1; then
  cat "$work/init.log" >&2
  die "openenv init failed (output above)"
fi
env_dir="$work/out/$ENV_NAME"
[[ -f "$env_dir/server/Dockerfile" ]] || { cat "$work/init.log" >&2; die "openenv init wrote no $env_dir/server/Dockerfile"; }
# `openenv init` only warns when `uv lock` fails; unpinned, the build would resolve afresh.
[[ -f "$env_dir/uv.lock" ]] || { cat "$work/init.log" >&2; die "openenv init wrote no uv.lock (output above)"; }
locked=$(grep -A1 '^name = "openenv"$' "$env_dir/uv.lock" | sed -n 's/^version = "\(.*\)"$/\1/p')
[[ "$locked" == "$openenv_version" ]] \
  || die "the env's uv.lock pins openenv ${locked:-(none)}, not $openenv_version that generated the env"
log "generated $(find "$env_dir" -type f | wc -l) files, uv.lock pins $(grep -c '^name = ' "$env_dir/uv.lock") packages"

# The build as `openenv build` runs it (standalone mode: context = the env folder, its
# server/Dockerfile, BUILD_MODE and ENV_NAME), with the base image and inputs label added.
# The compose file sits outside the context, so the image does not carry it.
cat >"$work/compose.yaml" <<EOF
services:
  template:
    image: $NAME
    build:
      context: $env_dir
      dockerfile: server/Dockerfile
      args:
        BASE_IMAGE: $BASE_IMAGE
        BUILD_MODE: standalone
        ENV_NAME: $ENV_NAME
      labels:
        ai.denv.inputs: "$hash"
EOF

old_id=$(docker image inspect -f '{{.Id}}' "$NAME" 2>/dev/null || true)
log "building $NAME from openenv $openenv_version's generated server/Dockerfile (inputs $hash, BASE_IMAGE=$BASE_IMAGE)"
build_start=$SECONDS
# Compose tries buildx's bake first; without buildx it says so and builds on its own.
if ! docker compose -f "$work/compose.yaml" -p denv-openenv-template --progress plain \
      build "${no_cache[@]}" 2>&1 | grep --line-buffered -v "build using Bake, but buildx isn't installed" \
    | sed -u "s/^/[$LOG_TAG] /"; then
  die "building $NAME failed (output above)"
fi
[[ "$(docker image inspect -f '{{index .Config.Labels "ai.denv.inputs"}}' "$NAME" 2>/dev/null)" == "$hash" ]] \
  || die "building $NAME failed (output above)"
echo "$hash" >"$stamp"
# The image this one replaces is now untagged: drop it unless a container still uses it.
if [[ -n "$old_id" && "$old_id" != "$(docker image inspect -f '{{.Id}}' "$NAME")" ]]; then
  docker image rm "$old_id" >/dev/null 2>&1 || true
fi
log "built $NAME in $((SECONDS - start))s (docker build $((SECONDS - build_start))s)"
