#!/usr/bin/env bash
# Build one denv image from a folder, only when its inputs changed.
#   images/build.sh -t NAME [--pins] [--with-denv] [--force] DIR
# DIR holds a Dockerfile that takes `ARG BASE_IMAGE` (default python:3.11-slim); it is built
# FROM denv-python-base:3.11 (scripts/base-image.sh). The build context is a temporary copy
# of DIR plus, when present:
#   denv-ca.crt      the host's CA bundle (TLS is intercepted on some machines: pip needs it)
#   constraints.txt  pins from uv.lock, so images get the locked versions (--pins)
#   denv-*.whl       the denv wheel built from this checkout (--with-denv, implies --pins)
# Dockerfiles COPY those with a glob (`denv-ca.cr[t]`), so a plain `docker build DIR` works too.
# Up to date = the stamp .cache/images/<NAME>.stamp and the image's label ai.denv.inputs both
# equal the hash of: the files of DIR, this script, the base image id, uv.lock with --pins,
# and the denv sources with --with-denv.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE="${DENV_BASE_IMAGE:-denv-python-base:3.11}"
CA_BUNDLE="${DENV_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
STAMPS=.cache/images

log() { echo "images: $*" >&2; }
die() { log "error: $*"; exit 1; }

name="" dir="" with_denv=0 with_pins=0 force=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -t) name="${2:?-t needs an image name}"; shift 2 ;;
    --pins) with_pins=1; shift ;;
    --with-denv) with_denv=1; with_pins=1; shift ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [[ -z "$dir" ]] || die "one folder only, got '$dir' and '$1'"; dir="${1%/}"; shift ;;
  esac
done
[[ -n "$name" && -n "$dir" ]] || die "usage: images/build.sh -t NAME [--pins] [--with-denv] [--force] DIR"
[[ -f "$dir/Dockerfile" ]] || die "no Dockerfile in '$dir'"

base_id=$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE" 2>/dev/null) \
  || die "base image $BASE_IMAGE is missing: run scripts/base-image.sh (or make images)"

# The files that define the image: tracked and untracked-but-not-ignored, so a new file
# counts before it is committed.
inputs() {
  git ls-files -co --exclude-standard -- "$dir" images/build.sh
  if [[ $with_pins -eq 1 ]]; then
    echo uv.lock
  fi
  if [[ $with_denv -eq 1 ]]; then
    git ls-files -co --exclude-standard -- denv adapters generated pyproject.toml
  fi
}
hash=$({
  echo "base $base_id"
  inputs | LC_ALL=C sort -u | while read -r f; do
    [[ -f "$f" ]] && printf '%s %s\n' "$(sha256sum <"$f" | cut -c1-64)" "$f"
  done
} | sha256sum | cut -c1-16)

stamp="$STAMPS/${name//[:\/]/_}.stamp"
# Several makes may build at once on a shared machine: one build of an image at a time,
# and the second finds it up to date.
mkdir -p "$STAMPS"
exec 9>"${stamp%.stamp}.lock"
if ! flock -n 9; then
  log "waiting for another build of $name"
  flock 9
fi
if [[ $force -eq 0 && -f "$stamp" && "$(cat "$stamp")" == "$hash" ]] \
   && [[ "$(docker image inspect -f '{{index .Config.Labels "ai.denv.inputs"}}' "$name" 2>/dev/null)" == "$hash" ]]; then
  log "$name is up to date ($hash)"
  exit 0
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp -a "$dir/." "$ctx/"
if [[ -s "$CA_BUNDLE" ]]; then
  cp "$CA_BUNDLE" "$ctx/denv-ca.crt"
fi
if [[ $with_pins -eq 1 ]]; then
  [[ -x .venv/bin/uv ]] || die "no .venv/bin/uv to read uv.lock: run scripts/bootstrap.sh"
  # --no-header: the header names the output path, a new temp dir each time, which would
  # change the file and so miss the Docker layer cache of the big pip install.
  .venv/bin/uv export --frozen --no-dev --extra openenv --no-emit-project --no-hashes \
    --no-header --quiet >"$ctx/constraints.txt"
fi
if [[ $with_denv -eq 1 ]]; then
  .venv/bin/uv build --wheel --out-dir "$ctx" --quiet
  rm -f "$ctx/.gitignore"  # uv build leaves one in the out dir
fi

# Debian's docker.io has no buildx: use the classic builder there rather than let the
# CLI print its deprecation notice and fall back on its own.
if ! docker buildx version >/dev/null 2>&1; then
  export DOCKER_BUILDKIT=0
fi

old_id=$(docker image inspect -f '{{.Id}}' "$name" 2>/dev/null || true)
log "building $name from $dir (inputs $hash, FROM $BASE_IMAGE)"
start=$SECONDS
short=${name%%:*}
short=${short#denv-}
if ! docker build \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --label "ai.denv.inputs=$hash" \
    -t "$name" "$ctx" 2>&1 | grep --line-buffered -v -e '^DEPRECATED: The legacy builder' \
      -e '^ *BuildKit is currently disabled' -e '^ *environment-variable\.$' \
      -e '^ *Install the buildx component' -e '^ *https://docs.docker.com/go/buildx' \
    | sed -u "s/^/[$short] /"; then
  die "building $name failed (output above)"
fi
# Belt and braces: the image now carries this build's inputs hash.
[[ "$(docker image inspect -f '{{index .Config.Labels "ai.denv.inputs"}}' "$name" 2>/dev/null)" == "$hash" ]] \
  || die "building $name failed (output above)"
mkdir -p "$STAMPS"
echo "$hash" >"$stamp"
# The image this one replaces is now untagged: drop it unless a container still uses it
# (its layers shared with the new image stay, as the new image's cache).
if [[ -n "$old_id" && "$old_id" != "$(docker image inspect -f '{{.Id}}' "$name")" ]]; then
  docker image rm "$old_id" >/dev/null 2>&1 || true
fi
log "built $name in $((SECONDS - start))s"
