"""`make first-hour`: a newcomer's first hour, measured (issue 26 item 6).

From a fresh clone of this checkout's HEAD (`git clone`, in a temporary directory), as a
newcomer would after the README's `make demo`: the fork demo, then each ```python block of
the README as a script of its own (`.venv/bin/python block.py`, paying OpenEnv's import each
time), with no DENV_SERVER, so the first one starts a local `denv serve`, in a state
directory of its own. Each step's wall time, exit status, progress lines (stderr) and what
it left running (envs of the key, containers of that server) are written to
bench/results/first-hour.json; then the server is stopped and the script checks that nothing
is left: no container or network of that server, no mount under its state directory, no
server process.

By default it does not build: it reuses this checkout's `.venv` and the echo image already
on the engine, naming the image's id and age, and runs the demo script itself. With
`--fresh` (`make first-hour-fresh`) it builds as a newcomer does: it removes this project's
images from the engine (`make images-remove`, as CI starts), then runs the README's first
command, `make demo`, in the clone, which builds the clone's venv, the base image and the
echo image from nothing, and the blocks then run on the clone's own `.venv/bin/python`.
Either way it does not run the README's second command, `make test` (the whole suite, which
CI runs on a fresh clone; the README's blocks are its tests/e2e/test_docs_snippets.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_snippets import snippets

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "first-hour.json"
IMAGE = "denv-echo-env:latest"
STEP_TIMEOUT_S = 900


def sh(*cmd: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]


def instance(state: Path) -> str | None:
    db = state / "denv.db"
    if not db.exists():
        return None
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT value FROM meta WHERE key='instance'").fetchone()
    return str(row[0]) if row else None


def running(state: Path) -> dict[str, list[str]]:
    """Containers and networks of the state dir's server, and mounts under the dir."""
    found: dict[str, list[str]] = {"containers": [], "networks": [], "mounts": []}
    inst = instance(state)
    if inst:
        label = f"label=denv.instance={inst}"
        found["containers"] = sh("docker", "ps", "-aq", "--filter", label).stdout.split()
        found["networks"] = sh("docker", "network", "ls", "-q", "--filter", label).stdout.split()
    root = str(state.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        found["mounts"] = [ln.split()[4] for ln in f if ln.split()[4].startswith(root)]
    return found


def envs_of_key(python: str, env: dict[str, str]) -> list[str] | str:
    code = (
        "import json\nfrom denv import Denv\n"
        "with Denv(detach=True) as d: print(json.dumps([e.id for e in d.list_envs()]))"
    )
    run = sh(python, "-c", code, env=env)
    return json.loads(run.stdout) if run.returncode == 0 else run.stderr[-500:]


def step(
    name: str, cmd: list[str], cwd: Path, env: dict[str, str], state: Path, python: str
) -> dict[str, object]:
    print(f"first-hour: {name} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        run = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S
        )
        code, out, err = run.returncode, run.stdout, run.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = -9, str(exc.stdout or ""), str(exc.stderr or "")
    seconds = round(time.monotonic() - started, 1)
    time.sleep(2)  # a closed lease's envs go on a server thread, at once but not in the reply
    left = running(state)
    result: dict[str, object] = {
        "step": name,
        "seconds": seconds,
        "exit": code,
        "progress": [
            ln for ln in err.splitlines() if ln.startswith("denv: ") or "denv.progress" in ln
        ],
        "envs_left": envs_of_key(python, env),
        "containers_left": len(left["containers"]),
    }
    if code != 0:
        result["output_tail"] = (out + err)[-2000:]
    print(f"first-hour: {name}: exit {code} in {seconds}s", file=sys.stderr, flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fresh", action="store_true", help="remove the images, then `make demo` in the clone"
    )
    fresh = parser.parse_args().fresh
    image = sh("docker", "image", "inspect", "-f", "{{.Id}} {{.Created}}", IMAGE).stdout.split()
    if not image and not fresh:
        print(f"first-hour: {IMAGE} is not on the engine: run `make demo` first", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="denv-first-hour-"))
    clone, state = work / "denv", work / "state"
    python = str((clone if fresh else ROOT) / ".venv" / "bin" / "python")
    results: dict[str, object] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": sh("git", "-C", str(ROOT), "rev-parse", "HEAD").stdout.strip(),
        "load_average_at_start": os.getloadavg(),
        "not_run": "make test (the whole suite, which CI runs on a fresh clone; the README's "
        "blocks are its tests/e2e/test_docs_snippets.py)",
    }
    if fresh:
        results["fresh"] = (
            "make images-remove, then `make demo` in the clone: its venv, the base image and "
            "the echo image built from nothing, the blocks run on the clone's .venv/bin/python"
        )
    else:
        results["reused"] = {
            "venv": f"{ROOT}/.venv (not rebuilt: scripts/bootstrap.sh, uv sync --locked)",
            "image": f"{IMAGE} {image[0][:19]} created {image[1]} (not rebuilt: make image-echo)",
        }
    steps: list[dict[str, object]] = []
    env = {k: v for k, v in os.environ.items() if k not in ("DENV_SERVER", "DENV_API_KEY")}
    env.update(DENV_STATE_DIR=str(state), PYTHONUNBUFFERED="1")  # a first start: no server
    if not fresh:
        env.update(PYTHONPATH=f"{clone}:{clone}/generated")  # the clone's code, the venv reused
    started = time.monotonic()
    try:
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        if fresh:
            removed = sh("make", "--no-print-directory", "images-remove", cwd=clone)
            results["images_removed"] = removed.stderr.strip().splitlines()[:1]
            demo = step("make demo", ["make", "demo"], clone, env, state, python)
        else:
            demo = step(
                "make demo (examples/fork_demo.py)",
                [python, "examples/fork_demo.py"],
                clone,
                env,
                state,
                python,
            )
        steps.append(demo)
        for snippet in snippets(clone / "README.md", clone):
            if snippet.not_run:
                continue
            path = clone / f"readme_{snippet.line}.py"  # saved in the clone, as a reader does
            path.write_text(snippet.code)
            name = f"README.md:{snippet.line}"
            steps.append(step(name, [python, str(path)], clone, env, state, python))
    finally:
        stop = sh(python, "-m", "denv", "stop", env=env)
        left = running(state)
        server = sh("pgrep", "-f", f"denv.server --port 0 --state-dir {state}").stdout.split()
        results["total_seconds"] = round(time.monotonic() - started, 1)
        results["steps"] = steps
        results["after_denv_stop"] = {"exit": stop.returncode, **left, "server_processes": server}
        results["nothing_left"] = not any(left.values()) and not server
        for c in left["containers"]:
            sh("docker", "rm", "-f", c)
        for n in left["networks"]:
            sh("docker", "network", "rm", n)
        for m in sorted(left["mounts"], key=len, reverse=True):
            sh("umount", "-l", m)
        shutil.rmtree(work, ignore_errors=True)
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"first-hour: {OUT.relative_to(ROOT)}: nothing left: {results['nothing_left']}",
        file=sys.stderr,
    )
    return 0 if results["nothing_left"] and all(s["exit"] == 0 for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
