# Benchmarks (bench/), included by the Makefile. They never run in `make test` and never
# assert on time; results go to bench/results/ (<name>.json, SUMMARY.md, PNG plots).
#   make bench          the full run (~35 min on 2 quiet cores): the committed results
#   make bench-quick    a small run (< 3 min) that checks the benchmarks work; its results go
#                       to .cache/bench-quick/, so the committed full run is never overwritten
# BENCH_ARGS passes options, e.g. BENCH_ARGS="--only start,latency".

BENCH_STATE_DIR ?= /tmp/denv-bench-$(shell id -u)
BENCH_ARGS ?=

.PHONY: bench bench-quick bench-report bench-limits bench-trainer bench-live bench-egress bench-cluster bench-cluster-isolated bench-relay bench-upload bench-layer-stream bench-console

bench: $(VENV_STAMP) docker images
	$(PY) -m bench --state-dir $(BENCH_STATE_DIR) $(BENCH_ARGS)

bench-quick: $(VENV_STAMP) docker images
	$(PY) -m bench --quick --out .cache/bench-quick --state-dir $(BENCH_STATE_DIR) $(BENCH_ARGS)

## Issue 15's targets alone: 16 warm starts against LocalDockerProvider, AsyncDenv gather
## against sequential Denv calls, Denv.diff of a 1 GB volume (bench/bench_trainer.py).
bench-trainer: $(VENV_STAMP) docker images
	$(PY) -m bench --only trainer --state-dir $(BENCH_STATE_DIR) $(BENCH_ARGS)

## Issue 14's targets alone: live fork(8) against a warm volume fork, the sustained rate, a live
## child's memory, and the tree search by live forks, warm volume forks and replay.
bench-live: $(VENV_STAMP) docker images
	$(PY) -m bench --only live,live_tree --state-dir $(BENCH_STATE_DIR) $(BENCH_ARGS)

## Rewrite bench/results/SUMMARY.md and the plots from the result files.
bench-report: $(VENV_STAMP)
	$(PY) -m bench --report-only

## What the limits (memory, pids, CPUs, /work size) cost a cold start, a warm fork(8), a snapshot.
bench-limits: $(VENV_STAMP) docker images
	$(PY) -m bench.bench_limits --state-dir $(BENCH_STATE_DIR)-limits

## Issue 28's targets: the console's first page with 500 envs and a fork's arrival in an open
## tree, in Debian's Chromium (bench/bench_console.py).
bench-console: $(VENV_STAMP) docker chromium images
	$(PY) -m bench.bench_console --state-dir $(BENCH_STATE_DIR)-console

## What egress costs: a cold start with deny, allow and an allowlist; the firewall's own operations.
bench-egress: $(VENV_STAMP) docker images
	$(PY) -m bench.bench_egress --state-dir $(BENCH_STATE_DIR)-egress

## Issue 18's targets: warm fork(8) across 3 local nodes against 1 node, capacity with per-node
## caps on 3 nodes against 1, a snapshot to durable (bench/bench_cluster.py; ~10 min).
bench-cluster: $(VENV_STAMP) docker images
	$(PY) -m bench.bench_cluster $(BENCH_ARGS)

## The same on nodes that share nothing (denv cluster up --isolated: a network namespace, a
## Docker Engine and a relay each): bench/results/cluster-isolated.{json,md} (~15 min).
bench-cluster-isolated: $(VENV_STAMP) docker images
	$(PY) -m bench.bench_cluster --isolated $(BENCH_ARGS)

## Issue 27's relay target: a WebSocket step through the ingress straight to an env against
## through a node relay in its own process, side by side (bench/bench_relay.py; ~1 min).
bench-relay: $(VENV_STAMP)
	$(PY) -m bench.bench_relay $(BENCH_ARGS)

## Issue 18: layer pack+upload and fetch+unpack MB/s over loopback to SeaweedFS, beside cp -a
## (bench/bench_upload.py; no images; ~3 min).
bench-upload: $(VENV_STAMP)
	$(PY) -m bench.bench_upload

## Issue 27's streaming layers: a 2 GB layer node to node, to the store and back on a local
## 3-node cluster, MB/s and each agent's peak RSS growth (bench/bench_layer_stream.py; ~3 min,
## ~10 GB of disk while it runs).
bench-layer-stream: $(VENV_STAMP)
	$(PY) -m bench.bench_layer_stream $(BENCH_ARGS)
