# The TRL example's venv (torch on the CPU, TRL, transformers), included by the Makefile.
#   make trl-venv   build .cache/trl-venv (scripts/trl-venv.sh); rebuilt when its inputs change
# `make test` depends on it: tests/e2e/test_trl_grpo.py runs examples/trl_grpo.py in it.

TRL_VENV_STAMP := .cache/trl-venv/.denv-built

.PHONY: trl-venv
trl-venv: $(TRL_VENV_STAMP)

$(TRL_VENV_STAMP): $(VENV_STAMP) examples/trl-requirements.txt scripts/trl-venv.sh pyproject.toml uv.lock
	scripts/trl-venv.sh
	touch $@
