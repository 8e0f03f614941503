#!/usr/bin/env bash
# The live-fork end-to-end tests, run against the installed wheel instead of the source tree.
#
# Users install `denv[openenv]`, not this checkout: a runtime file the wheel leaves out (the
# live-fork launcher once was) breaks every installed live fork while every test of the
# source tree passes. So: build the wheel, install it with the one line users copy into a
# clean venv (plus the test runner), copy the tests (not the sources) to a folder of their
# own, check that `denv` there is the installed one, and run the live-fork e2e tests with
# that venv's Python, which is also what starts their `denv serve`.
#
# Needs what `make test` sets up: the Docker Engine and the project's images.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# What needs the wheel's own files: the launcher and its start-up hook (a live fork, a
# refusal, OpenEnv's own start form and gunicorn's, which the hook takes over in a process
# below pid 1, and starts copied from a zygote, reseeded; a child in a network namespace of
# its own, which the launcher sets up itself; memory the launcher marks for merging; servers
# on uvloop, which the hook moves to asyncio's loop; the gVisor runtime's script, which
# `denv gvisor install` copies from the package, and which resumes a fork's children from
# their parent's checkpoint). The source-tree run has the rest of these modules.
TESTS=(
  tests/e2e/test_live_fork.py::test_live_fork_keeps_the_session_and_separates_work
  tests/e2e/test_live_fork.py::test_live_refused_with_the_reason
  "tests/e2e/test_live_start_forms.py::test_each_start_form_runs_live_and_forks[openenv-init]"
  "tests/e2e/test_live_start_forms.py::test_each_start_form_runs_live_and_forks[gunicorn-1]"
  tests/e2e/test_live_start_forms.py::test_a_server_that_cannot_be_copied_is_refused_with_the_reason
  tests/e2e/test_zygotes.py
  tests/e2e/test_live_netns.py::test_children_are_apart_and_served
  tests/e2e/test_live_merge.py
  tests/e2e/test_live_shapes.py
  tests/e2e/test_gvisor.py::test_the_registered_runtime_is_this_packages_script
  tests/e2e/test_gvisor.py::test_gvisors_kernel_answers_what_runc_passes_to_the_hosts
  tests/e2e/test_gvisor.py::test_a_fork_resumes_the_parents_sandbox_memory_included
)

echo "test-installed: building the wheel and a clean venv" >&2
.venv/bin/uv build --wheel --out-dir "$work/dist" --quiet
python3 -m venv "$work/venv"
whl=$(ls "$work"/dist/denv-*.whl)
# The test runner at the versions the project's own venv runs.
runner=$(.venv/bin/python -c 'from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in ("pytest", "pytest-timeout")))')
# shellcheck disable=SC2086
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "${whl}[openenv]" $runner

mkdir -p "$work/run/tests"
cp tests/conftest.py tests/private_dockerd.py tests/live_procs.py "$work/run/tests/"  # imported by conftest, e2e
cp -r tests/e2e "$work/run/tests/e2e"
find "$work/run" -name __pycache__ -prune -exec rm -rf {} +
cat >"$work/run/pytest.ini" <<'INI'
[pytest]
addopts = -rs -p no:cacheprovider
timeout = 600
markers =
    e2e: needs a Docker Engine and the local server
INI
cd "$work/run"
"$work/venv/bin/python" - "$root" <<'PY'
import sys
from pathlib import Path

import denv
from denv.server.docker.live import launcher_ctl

where = Path(denv.__file__).resolve()
assert "site-packages" in where.parts, f"denv is imported from {where}, not the wheel"
assert not where.is_relative_to(Path(sys.argv[1]).resolve()), f"denv comes from the checkout: {where}"
for name in ("launcher.py", "_denv_live.py", "sitecustomize.py"):
    assert (launcher_ctl.LAUNCHER_DIR / name).is_file(), f"the wheel has no live-fork launcher {name}"
print(f"test-installed: denv from {where.parent}")
PY
"$work/venv/bin/python" -m pytest -q "${TESTS[@]}"
