# denv: the two commands a new machine needs are `make demo` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
VENV_STAMP := .venv/.denv-synced

.PHONY: demo test unit e2e lint regen regen-check wheel-check docker cassettes conformance e2e-frameworks bench bench-quick clean-state

$(VENV_STAMP): pyproject.toml uv.lock
	scripts/bootstrap.sh
	touch $@

docker:
	scripts/ensure-docker.sh

-include mk/images.mk

## The fork demo (issue 5 brings it).
demo: $(VENV_STAMP)
	@echo "make demo: the fork demo arrives with issue 5 (reference environments and the demo); it is not built yet." >&2
	@exit 1

## Every test: unit tests on cassettes, then end-to-end tests on a real Docker Engine.
test: $(VENV_STAMP) docker images
	$(PY) -m pytest -q

unit: $(VENV_STAMP)
	$(PY) -m pytest -q -m "not e2e"

lint: $(VENV_STAMP)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

regen:
	scripts/regen.sh

regen-check:
	scripts/regen.sh --check

wheel-check: $(VENV_STAMP)
	scripts/check_wheel.sh

cassettes: $(VENV_STAMP) docker images
	$(PY) scripts/record_cassettes.py
