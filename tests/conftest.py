"""Shared fixtures: a real local denv server in a subprocess.

``denv_server`` (session scope) yields ``LocalDenv(url, key, state_dir)``; unpack it as
``url, key, state_dir = denv_server``. The server runs ``python -m denv.server --port 0``
with a temporary state dir; at the end it is stopped and every container, network and mount
of its instance is removed, and the state dir deleted. For a server of your own (e.g. to
check restarts or leftovers) use ``with start_server(state_dir) as srv: ...``.

A second API key for the same server: ``denv.server.auth.create_api_key(state_dir)``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
from private_dockerd import DaemonDidNotStart, DnsRecorder, PrivateDockerd

if TYPE_CHECKING:
    from denv import Denv

#: The type of the ``clients`` fixture.
Clients = Callable[..., "Denv"]

START_TIMEOUT_S = 60.0
CLUSTER_DIR = Path(__file__).parent / "cluster"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The cluster's tests run last: their local cluster (3 Ray nodes, SeaweedFS, a control
    plane) is a session fixture, alive from its first test to the end of the run, and must
    not load the machine under the other suites (the flood test measures latency ratios)."""
    items.sort(key=lambda item: Path(str(item.path)).is_relative_to(CLUSTER_DIR))


class LocalDenv(NamedTuple):
    url: str
    key: str
    state_dir: Path
    proc: subprocess.Popen[bytes] | None = None


def instance_id(state_dir: Path) -> str | None:
    """The ``denv.instance`` label value of the server of ``state_dir``."""
    db = state_dir / "denv.db"
    if not db.exists():
        return None
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT value FROM meta WHERE key='instance'").fetchone()
    return str(row[0]) if row else None


def pooled_fs_contents(pool_mount: str) -> list[str]:
    """What a pooled volume filesystem (``<state>/volfs/pool/<n>/fs``) holds beyond its
    empty ``lost+found``, ``upper`` and ``work``: nothing, when the pool emptied it."""
    fs = Path(pool_mount)
    extra = [p.name for p in fs.iterdir() if p.name not in ("lost+found", "upper", "work")]
    return extra + [str(p) for d in ("upper", "work") for p in (fs / d).iterdir()]


def leftovers(state_dir: Path, *, pool_ok: bool = True) -> dict[str, list[str]]:
    """Containers, networks and mounts of this state dir's server that still exist.

    An emptied volume filesystem in the server's pool (``volfs/pool``) is not a leftover
    while the server runs (``pool_ok``); one that still holds files is."""
    inst = instance_id(state_dir)
    found: dict[str, list[str]] = {"containers": [], "networks": [], "mounts": [], "cgroups": []}
    if inst:
        # the CPU groups of its API keys (denv.server.docker.cgroups.key_parent)
        found["cgroups"] = sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/denv-{inst}-*"))
        label = f"label=denv.instance={inst}"
        for kind, cmd in (("containers", ["ps", "-aq"]), ("networks", ["network", "ls", "-q"])):
            out = subprocess.run(
                ["docker", *cmd, "--filter", label], capture_output=True, text=True, check=False
            ).stdout
            found[kind] = out.split()
    root = str(state_dir.resolve())
    with open("/proc/self/mountinfo") as f:
        found["mounts"] = [ln.split()[4] for ln in f if ln.split()[4].startswith(root + "/")]
    pool = root + "/volfs/pool/"
    if pool_ok:
        found["mounts"] = [
            m
            for m in found["mounts"]
            if not (m.startswith(pool) and m.endswith("/fs") and not pooled_fs_contents(m))
        ]
    return found


def clean(state_dir: Path) -> None:
    """Remove whatever the server of ``state_dir`` left (after it stopped), then the dir."""
    left = leftovers(state_dir, pool_ok=False)
    if left["containers"]:
        subprocess.run(["docker", "rm", "-f", *left["containers"]], capture_output=True)
    if left["networks"]:
        subprocess.run(["docker", "network", "rm", *left["networks"]], capture_output=True)
    for group in leftovers(state_dir, pool_ok=False)["cgroups"]:
        with contextlib.suppress(OSError):
            Path(group).rmdir()
    for _ in range(10):
        mounts = leftovers(state_dir, pool_ok=False)["mounts"]
        if not mounts:
            break
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
    keep_logs(state_dir)
    shutil.rmtree(state_dir, ignore_errors=True)


def keep_logs(state_dir: Path) -> None:
    """Copy the server's logs beside ``state_dir`` (``NAME-logs``) before it is removed: a
    failure in CI is read from them (pytest keeps its last three base temp dirs)."""
    kept = state_dir.with_name(f"{state_dir.name}-logs")
    for name in ("server.log", "server.out"):
        if (state_dir / name).is_file():
            kept.mkdir(exist_ok=True)
            shutil.copyfile(state_dir / name, kept / name)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def docker_engine(*images: str, build: str = "make images") -> Any:
    """A Docker Engine client that has all of ``images``; the test fails naming the fix if not.

    Set-up (``make test``) installs the venv, starts the engine and builds every image, so a
    missing piece here is a failure to report, never a reason to skip.
    """
    try:
        import docker
    except ImportError as exc:
        pytest.fail(
            f"the docker Python package is missing ({exc}): "
            "install the venv (scripts/bootstrap.sh; make test runs it)"
        )
    try:
        engine = docker.from_env()
        engine.ping()
    except Exception as exc:
        pytest.fail(f"no Docker Engine reachable ({exc}): start it (make docker)")
    for image in images:
        try:
            engine.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.fail(f"image {image} is not on the Docker Engine: build it ({build})")
    return engine


@contextmanager
def start_server(state_dir: Path, *extra: str, cleanup: bool = True) -> Iterator[LocalDenv]:
    """Run a server on a free port for ``state_dir``; stop it (and clean up) on exit."""
    from denv.local import read_local_server

    state_dir.mkdir(parents=True, exist_ok=True)
    log = open(state_dir / "server.out", "ab")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        # Zygotes (a second boot behind the first live create of each image) are off unless
        # a test asks for them (`--zygotes` in `extra`, which wins: the last flag counts).
        [
            sys.executable,
            "-m",
            "denv.server",
            "--port",
            "0",
            "--state-dir",
            str(state_dir),
            "--no-zygotes",
            *extra,
        ],
        stdout=log,
        stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    found = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while (found := read_local_server(state_dir)) is None or found.pid != proc.pid:
            if proc.poll() is not None or time.monotonic() > deadline:
                out = (state_dir / "server.out").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"denv server did not start (exit {proc.poll()}):\n{out}")
            time.sleep(0.05)
        yield LocalDenv(found.url, found.api_key, state_dir, proc)
    finally:
        if found is not None:
            close_idle_provider_connections(found.url)
        stop(proc)
        log.close()
        if cleanup:
            clean(state_dir)


def close_idle_provider_connections(url: str) -> None:
    """Close the DenvProvider connections to ``url`` that no provider holds: one idles for
    ``IDLE_KEEP_S`` (30 s) for the process's next provider, holding its lease, and once the
    server has stopped, closing that lease at the interpreter's exit fails ("could not close
    lease"). A user's server outlives the process; a test's server does not."""
    try:
        from denv.openenv import _connection
    except ImportError:  # installed without [openenv]: no provider connections
        return
    with _connection._kept_lock:
        kept = list(_connection._kept.values())
    for connection in kept:
        if connection._holders <= 0 and str(connection.denv.server).rstrip("/") == url.rstrip("/"):
            connection._close_if_idle()


@pytest.fixture
def clients() -> Iterator[Clients]:
    """``clients(srv, **options)``: a ``denv.Denv`` for the server ``srv``, closed (its lease
    with it) when the test ends, while a module's or the session's server still runs. A
    client left open closes its lease at the interpreter's exit, when that server has
    stopped ("could not close lease")."""
    from denv import Denv

    made: list[Denv] = []

    def make(srv: LocalDenv, **options: Any) -> Denv:
        made.append(Denv(srv.url, api_key=srv.key, **options))
        return made[-1]

    yield make
    for client in made:
        client.close()


@pytest.fixture(scope="session")
def denv_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    """A real local server shared by the session's e2e tests."""
    with start_server(tmp_path_factory.mktemp("denv-state")) as srv:
        yield srv


@pytest.fixture(scope="session")
def private_engine() -> Iterator[PrivateDockerd]:
    """A dockerd of the session's own with the stand-in image, whose only upstream resolver is
    its ``recorder`` (tests/private_dockerd.py). Point a server at it with ``DOCKER_HOST`` and a
    state dir under its ``state_dir``. The shared daemon and its docker0 are left alone."""
    if shutil.which("dockerd") is None:
        pytest.fail("no dockerd binary to run a private daemon with: install it (make docker)")
    shared_bridge = Path("/sys/class/net/docker0")
    had_shared_bridge = shared_bridge.exists()
    recorder = DnsRecorder()
    # The data root on a tmpfs: removing the image's files from disk took 9 s.
    daemon = PrivateDockerd(
        Path("/tmp") / f"denv-dockerd-{os.getpid()}",
        resolv_conf=f"nameserver {recorder.address}\n",
        tmpfs_mb=1024,
    )
    daemon.recorder = recorder
    try:
        try:
            daemon.start()
        except DaemonDidNotStart as exc:
            pytest.fail(f"a second dockerd did not start here (its log tail follows): {exc}")
        daemon.load("denv-http-standin:latest")
        yield daemon
    finally:
        daemon.remove()
        recorder.close()
    if had_shared_bridge and not shared_bridge.exists():
        pytest.fail("the private dockerd removed the shared daemon's docker0 bridge")
