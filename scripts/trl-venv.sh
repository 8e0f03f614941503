#!/usr/bin/env bash
# Build .cache/trl-venv for examples/trl_grpo.py and its test: torch (CPU), TRL, transformers,
# tokenizers and datasets, beside denv[openenv] (editable, at uv.lock's pins). Kept out of
# .venv, whose `uv sync` would remove what uv.lock does not hold.
#
# torch: this machine kind keeps PyTorch 2.13.0's CPU build on disk, where pip finds it
# (PIP_FIND_LINKS); the same `torch==2.13.0` from PyPI is the CUDA build, several GB with its
# nvidia packages. It is installed with pip, not uv, because uv does not look on that disk.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${DENV_TRL_VENV:-.cache/trl-venv}"
TORCH=2.13.0

if ! ls ${PIP_FIND_LINKS:-/opt/wheels}/torch-${TORCH}+cpu-*.whl >/dev/null 2>&1; then
  echo "trl-venv: no torch-${TORCH}+cpu wheel in ${PIP_FIND_LINKS:-/opt/wheels}:" \
       "pip will download the CUDA build of torch (about 3 GB)" >&2
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "torch==${TORCH}"
# denv's own dependencies at the versions uv.lock pins, so the example runs what CI tests.
.venv/bin/uv export --frozen --all-extras --no-dev --no-hashes --no-emit-project \
  --format requirements-txt --quiet >"$VENV/denv-constraints.txt"
"$VENV/bin/pip" install --quiet --disable-pip-version-check \
  -r examples/trl-requirements.txt -c "$VENV/denv-constraints.txt" -e '.[openenv]'
"$VENV/bin/python" -c 'import torch, trl; print(f"trl-venv: torch {torch.__version__}, trl {trl.__version__}")'
du -sh "$VENV" | sed 's/^/trl-venv: size /'
