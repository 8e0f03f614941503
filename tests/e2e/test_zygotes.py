"""End to end: zygotes (issue 24, item 3). A live create of an image the key has started
before is answered by a copy of an idle booted server of that image (its zygote): a fresh
env (own id, no parent, ``start: zygote``, a new OpenEnv session) with fresh entropy.

One server of its own (zygotes on, idle reaping after 6 s) and one image configuration: the
echo env's app with a ``/draws`` route that returns a draw of Python's ``random`` and one of
NumPy's global generator, and ``/note`` (a file in /work, read and written), started by a
shell command (no image to build). Its first start boots and leaves the zygote behind; the
rest copy it. Then a version of one of its envs, started live: its own zygote, copied with
the version's /work. The zygotes are found in the server's store (owner ``zygote:<key>``),
as a client never can.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, instance_id, leftovers, start_server
from denv.openenv import DenvProvider
from openenv.core import GenericEnvClient
from provider_helpers import ECHO_IMAGE, container_pid_of, message, state_of

from denv import Denv, Env
from denv.server.auth import create_api_key
from denv.server.docker.live import cgroups

pytestmark = pytest.mark.e2e

SHAPES_IMAGE = "denv-shapes-env:latest"  # uvicorn[standard]: uvloop (envs/shapes)

IDLE_MINUTES = 0.1  # the zygote is reaped after 6 s without a copy (the reaper runs every 5 s)
APP = """
import random
from pathlib import Path
import numpy as np
from echo_env.app import app

@app.get("/draws")
def draws():
    return {"random": random.random(), "numpy": float(np.random.random())}

@app.get("/note")
def get_note():
    p = Path("/work/note")
    return {"text": p.read_text() if p.exists() else None}

@app.put("/note")
def put_note(text: str):
    Path("/work/note").write_text(text)
    return {"text": text}
"""
COMMAND = [
    "sh",
    "-c",
    f"cat > /app/draws_app.py <<'EOF'\n{APP}\nEOF\n"
    "exec uvicorn draws_app:app --host 0.0.0.0 --port 8000",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    state = tmp_path_factory.mktemp("denv-zygotes")
    with start_server(state, "--zygotes", "--warm-idle-minutes", str(IDLE_MINUTES)) as srv:
        yield srv


def zygotes(server: LocalDenv) -> list[tuple[str, str, str]]:
    """(id, owner, status) of every zygote record the server holds, deleted ones too."""
    with sqlite3.connect(server.state_dir / "denv.db") as con:
        rows = con.execute(
            "SELECT id, owner, status FROM envs WHERE owner LIKE 'zygote:%' ORDER BY id"
        ).fetchall()
    return [(str(a), str(b), str(c)) for a, b, c in rows]


def wait_for(what: str, check: Any, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


def start(server: LocalDenv) -> tuple[DenvProvider, Any]:
    provider = DenvProvider(server=server.url, api_key=server.key)
    client = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=provider, cmd=COMMAND)
    return provider, client.sync()


def draws(provider: DenvProvider) -> dict[str, float]:
    out: dict[str, float] = httpx.get(f"{provider.base_url}/draws", timeout=10).json()
    return out


def test_a_live_start_copies_the_keys_zygote(server: LocalDenv) -> None:
    first, _ = start(server)
    started = [first]
    try:
        with Denv(server.url, server.key) as denv:
            assert str(denv.get_env(first.env_id or "").start) == "cold"
            # The first start left a zygote behind: one booted root, never handed out.
            ready = wait_for(
                "the zygote", lambda: [z for z in zygotes(server) if z[2] == "healthy"]
            )
            assert len(ready) == 1
            zygote_id, owner, _ = ready[0]
            assert owner.startswith("zygote:")
            # Before its first copy the zygote served one session-less request in-process
            # (OpenEnv's GET /metadata: the first Environment built, once) and holds no
            # OpenEnv session.
            said = wait_for("the zygote's warm-up", lambda: warmed(server, zygote_id))
            assert said["warm"]["path"] == "/metadata" and said["warm"]["status"] == 200
            assert said["sessions"] == 0 and not said["unknown_threads"]

            children = [start(server) for _ in range(2)]
            started += [p for p, _ in children]
            ids = [p.env_id or "" for p, _ in children]
            envs = [denv.get_env(i) for i in ids]
            assert [str(e.start) for e in envs] == ["zygote", "zygote"]
            assert len({first.env_id, *ids, zygote_id}) == 4
            assert all(e.parent_id is None for e in envs)
            assert len({e.version_id for e in envs}) == 2  # each its own, as a new env's
            for (_, client), env in zip(children, envs, strict=True):
                # A fresh server's session: no episode before its reset.
                assert state_of(client)["step_count"] == 0
                client.reset()
                client.step(message("hello"))
                assert state_of(client)["step_count"] == 1
                assert env.endpoints[0].url.startswith(server.url)
            # Fresh entropy in each copy: neither generator repeats the other copy's draws.
            a, b = (draws(p) for p, _ in children)
            assert a["random"] != b["random"] and a["numpy"] != b["numpy"]

            # The zygote is no env of the key: not listed, not gettable.
            listed = {e.id for e in denv.list_envs()}
            assert zygote_id not in listed and set(ids) <= listed

            # Another key never gets this key's zygote: its start boots.
            other = Denv(server.url, create_api_key(server.state_dir))
            with other:
                env = other.create_sandbox(ECHO_IMAGE, command=COMMAND, live="auto", wait="none")
                assert str(env.start) == "cold"
                other.delete_env(env.id)

            # A live fork keeps the parent's random state with reseed=False: both children
            # draw what the parent would have drawn next; by default each draws afresh.
            kept = first.fork(2, kind="live", reseed=False)
            fresh = first.fork(2, kind="live")
            started += kept + fresh
            k1, k2 = (draws(p) for p in kept)
            assert k1 == k2
            f1, f2 = (draws(p) for p in fresh)
            assert f1["random"] != f2["random"] and f1["numpy"] != f2["numpy"]
    finally:
        for p in started:
            p.stop_container()

    # Unused, the zygote is reaped (its container with it: no env of the group is left).
    wait_for("the zygote reaped", lambda: all(z[2] == "deleted" for z in zygotes(server)), 30)
    assert zygotes(server)
    inst = instance_id(server.state_dir)
    wait_for("no container left", lambda: not leftovers(server.state_dir)["containers"], 30)
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=denv.instance={inst}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == []


def hello_of(server: LocalDenv, env_id: str) -> dict[str, Any]:
    """What the env's server process's launcher says of it (``hello``)."""
    from denv.server.docker.live import launcher_ctl

    with sqlite3.connect(server.state_dir / "denv.db") as con:
        (raw,) = con.execute("SELECT runtime FROM envs WHERE id = ?", (env_id,)).fetchone()
    proc = json.loads(raw)["live"]
    return launcher_ctl.hello(launcher_ctl.Proc(int(proc["pid"]), int(proc["start"])))


def warmed(server: LocalDenv, env_id: str) -> dict[str, Any] | None:
    """The launcher's ``hello`` once the zygote's warm-up is done, else None."""
    said = hello_of(server, env_id)
    return said if said.get("warm") else None


def modules_of(server: LocalDenv, env_id: str) -> set[str]:
    """The modules the env's server process has imported (its launcher says)."""
    return set(hello_of(server, env_id)["modules"])


def note(env: Env, text: str | None = None) -> str | None:
    url = f"{env.endpoints[0].url.rstrip('/')}/note"
    r = httpx.put(url, params={"text": text}, timeout=10) if text else httpx.get(url, timeout=10)
    r.raise_for_status()
    out: str | None = r.json()["text"]
    return out


def test_creates_from_a_version_copy_its_zygote_each_with_the_versions_work(
    server: LocalDenv,
) -> None:
    """A live create from a stored version boots the first time and leaves a zygote of that
    version behind; the next ones copy it (those asked for while it boots wait for it). Each
    copy's /work is the version's, copy-on-write (a write in one is seen by no other), and
    the copy's first session imports nothing (the zygote imported what a server of its
    configuration imported once it served)."""
    made: list[str] = []
    with Denv(server.url, server.key) as denv:
        try:
            src = denv.create_sandbox(ECHO_IMAGE, command=COMMAND, live="auto")
            made.append(src.id)
            assert note(src, "saved") == "saved"
            version = denv.snapshot(src.id)
            before = {z[0] for z in zygotes(server)}

            [first] = denv.envs_from_version(version.id, live="auto")
            made.append(first.id)
            assert str(first.start) == "cold" and note(first) == "saved"
            # Its client's session, as a provider's would be (what the zygote learns from).
            with GenericEnvClient(base_url=first.endpoints[0].url).sync() as session:
                session.reset()

            # Asked for at once, while the version's zygote boots: they wait for it (rather
            # than boot two more) and are its copies.
            copies = denv.envs_from_version(version.id, 2, live="auto")
            made += [e.id for e in copies]
            assert [str(e.start) for e in copies] == ["zygote", "zygote"]
            [zygote_id] = [z[0] for z in zygotes(server) if z[0] not in before]
            assert {e.version_id for e in copies} == {version.id}  # its /work, nothing added
            assert zygote_id not in {e.id for e in copies}
            a, b = copies
            assert note(a) == "saved" and note(b) == "saved"
            assert note(a, "mine") == "mine"
            assert note(b) == "saved" and note(first) == "saved" and note(src) == "saved"

            # No module is imported in a copy's first session: the zygote holds them all.
            provider = DenvProvider(server=server.url, api_key=server.key)
            client: Any = GenericEnvClient.from_denv_version(version.id, provider=provider)
            with client.sync() as env:
                assert str(provider.start) == "zygote"
                fresh = modules_of(server, provider.env_id or "")
                env.reset()
                env.step(message("hello"))
                assert modules_of(server, provider.env_id or "") - fresh == set()
        finally:
            for env_id in made:
                denv.delete_env(env_id)
    # Unused, the version's zygote is reaped like any other.
    wait_for("the zygotes reaped", lambda: all(z[2] == "deleted" for z in zygotes(server)), 30)


CHURN_CLIENTS, CHURN_CYCLES = 4, 6


def memory_limits(env_id: str) -> dict[str, int | None]:
    """The v1 memory limits (memory, memory+swap) of the container of ``env_id``."""
    group = cgroups.group_of(container_pid_of(env_id))
    return cgroups._values(group.v1["memory"], "memory")


def test_copies_started_and_deleted_at_once_all_copy_the_zygote(server: LocalDenv) -> None:
    """Clients that start and delete envs at once (a trainer's group of rollouts) all get
    copies of the one zygote, and its container is back to its own limits once they are
    gone: each copy raised them by one env's share and gave it back. (Two copies doing so at
    once lost one's write; the next wrote a memory limit past memory+swap, its copy failed,
    the zygote was dropped and the start booted: docs/live-forks.md.)"""
    with Denv(server.url, server.key) as denv:
        first = denv.create_sandbox(ECHO_IMAGE, command=COMMAND, live="auto")
        try:
            [zygote_id] = wait_for(
                "the zygote", lambda: [z[0] for z in zygotes(server) if z[2] == "healthy"]
            )
            alone = memory_limits(zygote_id)

            def churn() -> list[str]:
                starts = []
                with Denv(server.url, server.key) as mine:
                    for _ in range(CHURN_CYCLES):
                        env = mine.create_sandbox(ECHO_IMAGE, command=COMMAND, live="auto")
                        starts.append(str(env.start))
                        mine.delete_env(env.id)
                return starts

            with ThreadPoolExecutor(CHURN_CLIENTS) as pool:
                runs = [pool.submit(churn) for _ in range(CHURN_CLIENTS)]
                starts = [s for run in runs for s in run.result()]
            assert starts == ["zygote"] * (CHURN_CLIENTS * CHURN_CYCLES)
            assert [z[0] for z in zygotes(server) if z[2] == "healthy"] == [zygote_id]
            wait_for("the copies' limits given back", lambda: memory_limits(zygote_id) == alone)
        finally:
            denv.delete_env(first.id)
    wait_for("the zygotes reaped", lambda: all(z[2] == "deleted" for z in zygotes(server)), 30)


def test_copies_of_a_uvloop_images_zygote_serve(server: LocalDenv) -> None:
    """An image with uvicorn[standard] (envs/shapes: uvloop is uvicorn's default loop where
    it is installed, as in most of OpenEnv's envs): its zygote serves on asyncio's loop, and
    every later start is a copy of it with a fresh session. (On uvloop every copy died, the
    zygote was dropped and the start booted again, 13-22 s, after a 500 from the fallback.)"""
    with Denv(server.url, server.key) as denv:
        first = denv.create_sandbox(SHAPES_IMAGE, live="auto")
        started: list[DenvProvider] = []
        try:
            assert first.live, first.live_unsupported
            [zygote_id] = wait_for(
                "the zygote", lambda: [z[0] for z in zygotes(server) if z[2] == "healthy"]
            )
            assert hello_of(server, zygote_id)["loop"] == "_UnixSelectorEventLoop"
            for i in range(3):
                p = DenvProvider(server=server.url, api_key=server.key)
                started.append(p)
                client = GenericEnvClient.from_docker_image(SHAPES_IMAGE, provider=p).sync()
                with client:
                    assert p.start == "zygote"
                    client.reset()
                    obs = client.step(message(f"copy {i}")).observation
                    assert obs["messages"] == [f"copy {i}"]  # a fresh episode in each
        finally:
            for p in started:
                p.stop_container()
            denv.delete_env(first.id)
    wait_for("the zygotes reaped", lambda: all(z[2] == "deleted" for z in zygotes(server)), 30)
