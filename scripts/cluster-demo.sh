#!/usr/bin/env bash
# make cluster-demo: the fork demo (examples/fork_demo.py) on a 3-node local cluster.
# `denv cluster up` starts 3 Ray nodes on this machine with their node agents, SeaweedFS and
# `denv serve --cluster`; the demo runs against it unchanged; `denv cluster down` stops all
# of it and removes what the nodes made, also when the demo fails or is interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_USAGE_STATS_ENABLED=0
dir="${DENV_CLUSTER_DIR:-/tmp/denv-cluster-demo-$(id -u)}"
trap '.venv/bin/denv cluster down --state-dir "$dir" --purge >/dev/null || true' EXIT
# As root, nodes that share nothing (each its own network namespace, address and Docker
# Engine, the demo's image copied into each: docs/cluster.md); DENV_CLUSTER_SHARED=1, or
# not root: nodes sharing this machine's engine.
topology=()
if [ "$(id -u)" = 0 ] && [ "${DENV_CLUSTER_SHARED:-}" != 1 ]; then
  topology=(--isolated --image denv-echo-env:latest)
fi
# `up` prints only the two export lines on stdout (its progress goes to stderr)
eval "$(.venv/bin/denv cluster up --nodes 3 "${topology[@]}" --state-dir "$dir")"
.venv/bin/denv cluster status --state-dir "$dir"
.venv/bin/python examples/fork_demo.py
.venv/bin/denv cluster status --state-dir "$dir"
