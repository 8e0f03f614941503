#!/usr/bin/env bash
# Build the wheel and import the three packages from a clean venv (not the source tree),
# installed with the one line users copy: denv[openenv] brings the local server too.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/uv build --wheel --out-dir "$work/dist" --quiet
python3 -m venv "$work/venv"
whl=$(ls "$work"/dist/denv-*.whl)
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "${whl}[openenv]"
# Every file of the source tree's packages is in the wheel: a runtime file left out of
# pyproject's package list (the live-fork launcher once was) fails here, not for users.
git ls-files denv adapters/openenv generated/denv_api_client >"$work/source-files"
python3 - "$whl" "$work/source-files" <<'PY'
import sys, zipfile

shipped = set(zipfile.ZipFile(sys.argv[1]).namelist())
wanted = {
    line.strip().replace("adapters/openenv/", "denv/openenv/", 1).removeprefix("generated/")
    for line in open(sys.argv[2])
    if line.strip()
}
missing = sorted(wanted - shipped)
if missing:
    sys.exit(
        "check_wheel: files of the source packages missing from the wheel (add their package "
        "to [tool.setuptools] packages or package-data in pyproject.toml):\n  "
        + "\n  ".join(missing)
    )
print(f"check_wheel: all {len(wanted)} files of the source packages are in the wheel")
PY
cd "$work"
"$work/venv/bin/python" - <<'PY'
import importlib.resources

import denv, denv.cli, denv.openenv, denv.openenv.export, denv.server.app, denv_api_client  # noqa: E401,F401
from denv.server.docker.live import launcher_ctl

assert (launcher_ctl.LAUNCHER_DIR / "launcher.py").is_file(), "the live-fork launcher is missing"
from denv.server.gvisor import runtime as gvisor_runtime

assert gvisor_runtime.SCRIPT.is_file(), "gVisor's runtime script (denv-runsc) is missing"
from denv.openenv._connection import _check_can_serve

_check_can_serve()  # the embedded default's packages (fastapi, uvicorn, docker) are there

templates = importlib.resources.files("denv.openenv.export") / "templates"
assert (templates / "Dockerfile.tmpl").is_file(), "export templates are missing from the wheel"
for shipped in ("denv-base-check.py", "harbor/docker-compose.yaml.tmpl", "harbor/tests.Dockerfile.tmpl"):
    assert (templates / shipped).is_file(), f"export template {shipped} is missing from the wheel"
runtime = importlib.resources.files("denv.openenv.export") / "runtime"
assert (runtime / "episode.py").is_file(), "the export runtime's episode.py is missing"
print("denv[openenv] imports denv, denv.openenv, denv.server, denv_api_client; export templates ship")
PY
