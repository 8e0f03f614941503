"""Shared pieces of the reliability suite: counts (CI or soak), API clients, leftovers.

``make test`` runs the suite with counts small enough for CI on two cores; ``make soak``
sets ``DENV_SOAK=1`` and the issue's full counts. Every test prints one summary line with
the counts it checked, e.g. ``leaks: 200 cycles, 0 containers, 0 networks, 0 mounts left``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, instance_id, leftovers

SOAK = os.environ.get("DENV_SOAK") == "1"
STANDIN = "denv-http-standin:latest"  # python -m http.server answering /health: starts fast
ECHO = "denv-echo-env:latest"  # the OpenEnv echo env (WebSocket steps)
# The stand-in's server, after it wrote a file into /work (so forks carry a layer).
STANDIN_CMD = [
    "sh",
    "-c",
    "echo seeded > /work/seed.txt; exec python3 -m http.server 8000 --directory /srv/www",
]
E2E_DIR = Path(__file__).resolve().parents[1] / "e2e"


def scale(ci: int, soak: int) -> int:
    """The count to run: the issue's number under ``make soak``, a CI-sized one otherwise."""
    return soak if SOAK else ci


def report(request: pytest.FixtureRequest, line: str) -> None:
    """Show a test's summary line in pytest's output (even under -q), and keep it."""
    request.node.user_properties.append(("summary", line))
    plugins = request.config.pluginmanager
    terminal, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if terminal is None or capture is None:
        print(line, file=sys.stderr)
        return
    with capture.global_and_fixture_disabled():
        terminal.write_line("")
        terminal.write_line(f"  {line}")


def api(srv: LocalDenv, key: str | None = None, timeout: float = 180) -> httpx.Client:
    return httpx.Client(
        base_url=srv.url,
        headers={"Authorization": f"Bearer {key or srv.key}"},
        timeout=timeout,
        trust_env=False,
    )


def ok(res: httpx.Response, status: int = 201) -> dict[str, Any]:
    assert res.status_code == status, f"{res.request.method} {res.request.url}: {res.text}"
    body: dict[str, Any] = res.json()
    return body


def standin(c: httpx.Client, **body: Any) -> dict[str, Any]:
    """A healthy stand-in env (unless ``wait`` says otherwise)."""
    return ok(c.post("/v1/sandboxes", json={"image": STANDIN, "command": STANDIN_CMD, **body}))


def live_env_ids(state_dir: Path) -> set[str]:
    """Envs the server's database does not count as deleted."""
    with sqlite3.connect(state_dir / "denv.db") as con:
        rows = con.execute("SELECT id FROM envs WHERE status != 'deleted'").fetchall()
    return {str(r[0]) for r in rows}


def all_leftovers(state_dir: Path) -> dict[str, list[str]]:
    """What no live env owns: containers, networks, Docker volumes, mounts, upper dirs,
    loop devices of volume filesystems.

    Containers and networks of a live env are not leftovers; with no live env, every
    container, network, mount and per-env dir of the server's instance is one.
    """
    found = leftovers(state_dir)
    live = live_env_ids(state_dir)
    inst = instance_id(state_dir)
    found["containers"] = [c for c in found["containers"] if _env_label(c) not in live]
    found["networks"] = [n for n in found["networks"] if _env_label(n, "network") not in live]
    out = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label=denv.instance={inst}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found["volumes"] = out.split()
    envs_dir = state_dir / "envs"
    found["upper_dirs"] = (
        # <env>/<service>/<n>/fs/upper: a volume's changes (on its own filesystem, volfs)
        [str(p) for p in sorted(envs_dir.glob("*/*/*/fs/upper")) if p.parts[-5] not in live]
        if envs_dir.is_dir()
        else []
    )
    found["mounts"] = [
        m for m in found["mounts"] if not any(f"/envs/{env_id}/" in m for env_id in live)
    ]
    found["loop_devices"] = [
        f"{dev}: {backing}"
        for dev, backing in loop_devices(envs_dir)
        if backing.split("/")[0] not in live
    ]
    return found


def loop_devices(envs_dir: Path) -> list[tuple[str, str]]:
    """(device, backing file relative to ``envs_dir``) of each loop device backed by a
    volume's filesystem image under ``envs_dir`` (the kernel appends " (deleted)" to a
    backing file that was removed while attached: still a leftover)."""
    prefix = str(envs_dir.resolve()) + "/"
    found = []
    for backing in sorted(Path("/sys/block").glob("loop*/loop/backing_file")):
        path = backing.read_text().strip()
        if path.startswith(prefix):
            found.append((backing.parent.parent.name, path.removeprefix(prefix)))
    return found


def _env_label(ident: str, kind: str = "container") -> str:
    cmd = ["docker", kind, "inspect", "--format", '{{index .Labels "denv.env"}}', ident]
    if kind == "container":
        cmd = ["docker", "inspect", "--format", '{{index .Config.Labels "denv.env"}}', ident]
    return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()


def leftover_line(found: dict[str, list[str]]) -> str:
    return ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in found.items()) + " left"


def assert_nothing_left(
    request: pytest.FixtureRequest, state_dir: Path, what: str, *, quiet: bool = False
) -> str:
    """Wait briefly for removals in flight, then assert nothing is left; the summary."""
    deadline = time.monotonic() + 30
    found = all_leftovers(state_dir)
    while any(found.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
        found = all_leftovers(state_dir)
    line = f"{what}, {leftover_line(found)}"
    if not quiet:
        report(request, line)
    assert not any(found.values()), found
    return line


def existing_envs(c: httpx.Client) -> list[dict[str, Any]]:
    """Every env of the client's key that is not deleted (all pages)."""
    envs: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        page = ok(c.get("/v1/envs", params=params), 200)
        envs += [e for e in page["items"] if e["status"] != "deleted"]
        cursor = page["next_cursor"]
        if not cursor:
            return envs


def delete_all(c: httpx.Client) -> int:
    """Delete every env of the client's key not yet deleted; how many there were."""
    envs = existing_envs(c)
    for env in envs:
        assert c.delete(f"/v1/envs/{env['id']}").status_code == 204
    return len(envs)


def container_of(env: dict[str, Any], service: str = "agent") -> str:
    return f"denv-{env['id'].lower()}-{service}"


def memory_kib(pid: int) -> dict[str, int]:
    """A process's resident memory now (``VmRSS``) and at its peak (``VmHWM``), in KiB."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0])
    return found
