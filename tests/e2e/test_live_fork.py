"""End to end: live forks (issue 14) of OpenEnv's reference echo env, unchanged.

A live fork copies the running server process: a child's OpenEnv session continues the
parent's (same episode_id and step_count, with no ForkableState in the env), each child's
/work starts from the parent's files and keeps its writes to itself, a fork taken while
other sessions are stepping completes every step, children are envs of their own (ids,
ingress URLs, deletes; they outlive their parent), and the server refuses live where it
cannot be done (409 naming the reason and the alternative).

/work is read and written from the host through /proc/PID/root (the test runs as root, as
the server does); the process of an env is found by the port its endpoint names.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from conftest import Clients, LocalDenv, leftovers, start_server
from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient
from provider_helpers import ECHO_IMAGE, assert_gone, live_pid, message, state_of
from websockets.sync.client import connect

from denv import Conflict, Denv, Env

pytestmark = pytest.mark.e2e


def provider(server: LocalDenv, **kwargs: Any) -> DenvProvider:
    return DenvProvider(server=server.url, api_key=server.key, **kwargs)


def pids_cgroup(cid: str) -> Path:
    """A container's pids cgroup (v1): under Docker's parent, or its API key's group."""
    found = list(Path("/sys/fs/cgroup/pids").glob(f"*/{cid}"))
    assert len(found) == 1, f"the pids cgroup of {cid[:12]}: {found}"
    return found[0]


def listening_pid(container: str, port: int) -> int:
    """The host pid of the process of ``container`` that listens on TCP ``port``."""
    info = docker.from_env().api.inspect_container(container)
    pid1 = info["State"]["Pid"]
    inodes = set()
    for line in Path(f"/proc/{pid1}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
            inodes.add(fields[9])
    # Every process of the container, live servers' own cgroups (docker/live/cgroups.py) too.
    tree = pids_cgroup(info["Id"])
    procs = [p for f in tree.rglob("cgroup.procs") for p in f.read_text().split()]
    for pid in procs:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = fd.readlink().as_posix()
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return int(pid)
    raise AssertionError(f"no process of {container[:12]} listens on {port}")


def work_of(env: Env, group: str) -> Path:
    """The env's /work as its own process sees it (its mount namespace); ``group`` is the
    env whose container it runs in (the one created with live=True)."""
    found = docker.from_env().containers.list(filters={"label": f"denv.env={group}"})
    assert len(found) == 1, found
    return Path(f"/proc/{live_pid(env.id)}/root/work")


def test_live_fork_keeps_the_session_and_separates_work(denv_server: LocalDenv) -> None:
    p = provider(denv_server, fork="live")
    root = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=p).sync()
    ids = [p.env_id or ""]
    d = Denv(denv_server.url, api_key=denv_server.key)
    with root:
        root.reset()
        root.step(message("prefix 1"))
        root.step(message("prefix 2"))
        parent_state = state_of(root)
        parent = d.get_env(p.env_id or "")
        assert parent.live and parent.start.value == "cold"
        group = parent.id
        parent_work = work_of(parent, group)
        (parent_work / "before.txt").write_text("parent's, before the fork")
        # The echo env also saves its episode under /work (ForkableState, for volume forks):
        # drop that file, so that only the copied memory can carry the session into children.
        (parent_work / ".denv" / "state.json").unlink()

        children = fork_clients(root, 3)
        ids += [c.provider.env_id or "" for c in children]
        try:
            envs = [d.get_env(c.provider.env_id or "") for c in children]
            assert [e.start.value for e in envs] == ["live"] * 3
            assert all(e.parent_id == parent.id and e.live for e in envs)
            assert len({e.endpoints[0].url for e in envs} | {parent.endpoints[0].url}) == 4
            assert not (work_of(envs[0], group) / ".denv" / "state.json").exists()
            # The session goes on in every child: the env's own Python state, not /work.
            for child in children:
                assert state_of(child) == parent_state
            children[0].step(message("only child 0"))
            assert state_of(children[0])["step_count"] == parent_state["step_count"] + 1
            assert state_of(children[1]) == parent_state
            assert state_of(root) == parent_state

            works = [work_of(e, group) for e in envs]
            assert [(w / "before.txt").read_text() for w in works] == [
                "parent's, before the fork"
            ] * 3
            (works[0] / "child0.txt").write_text("child 0's")
            (parent_work / "after.txt").write_text("parent's, after the fork")
            assert not (works[1] / "child0.txt").exists()
            assert not (parent_work / "child0.txt").exists()
            assert not any((w / "after.txt").exists() for w in works)

            # A child of a child: memory from its parent, the grandparent untouched.
            grand = fork_clients(children[0], 1)[0]
            ids.append(grand.provider.env_id or "")
            assert state_of(grand)["step_count"] == parent_state["step_count"] + 1
            grand_env = d.get_env(grand.provider.env_id or "")
            assert (work_of(grand_env, group) / "child0.txt").read_text() == "child 0's"
            grand.close()
        finally:
            for child in children:
                child.close()
    assert_gone(denv_server, [i for i in ids if i])


def test_live_fork_while_other_sessions_step(denv_server: LocalDenv) -> None:
    """Forks happen at a quiescent point: steps in flight complete, nothing deadlocks."""
    p = provider(denv_server, fork="live")
    root = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=p).sync()
    ids = [p.env_id or ""]
    url = (p.base_url or "").replace("http", "ws", 1) + "/ws"
    stop = threading.Event()
    done = [0, 0, 0]
    errors: list[BaseException] = []

    def stepper(i: int) -> None:
        try:
            with connect(url, open_timeout=30) as ws:
                ws.send(json.dumps({"type": "reset", "data": {}}))
                ws.recv(timeout=30)
                while not stop.is_set():
                    ws.send(json.dumps({"type": "step", "data": {"message": f"s{i}"}}))
                    reply = json.loads(ws.recv(timeout=30))
                    assert reply["type"] == "observation", reply
                    done[i] += 1
        except BaseException as exc:
            errors.append(exc)

    with root:
        root.reset()
        root.step(message("prefix"))
        threads = [threading.Thread(target=stepper, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        forks = 0
        for _ in range(5):
            children = p.fork(2)
            ids += [c.env_id or "" for c in children]
            for c in children:
                with connect((c.base_url or "").replace("http", "ws", 1) + "/ws") as ws:
                    ws.send(json.dumps({"type": "state"}))
                    # With several sessions open, a child continues the most recently
                    # active one (docs/live-forks.md): here a stepper's or the root's.
                    assert json.loads(ws.recv(timeout=30))["data"]["step_count"] >= 1
                c.stop_container()
            forks += 1
        stop.set()
        for t in threads:
            t.join(60)
        print(f"live forks while stepping: {forks} forks of 2, steps served: {done}")
        assert not errors, errors
        assert all(n > 0 for n in done)
        assert not any(t.is_alive() for t in threads)
        assert state_of(root)["step_count"] == 1
    assert_gone(denv_server, [i for i in ids if i])


def test_live_children_outlive_their_parent(denv_server: LocalDenv, clients: Clients) -> None:
    d = clients(denv_server)
    parent = d.create_sandbox(ECHO_IMAGE, live=True)
    assert parent.status.value == "healthy" and parent.live, parent.error
    fork = d.fork(parent.id, 2, kind="live")
    a, b = fork.envs
    d.delete_env(a.id)
    assert d.get_env(a.id).status.value == "deleted"
    d.delete_env(parent.id)
    time.sleep(0.5)
    alive = d.get_env(b.id)
    assert alive.status.value == "healthy", alive.error
    with connect(alive.endpoints[0].url.replace("http", "ws", 1) + "/ws") as ws:
        ws.send(json.dumps({"type": "reset", "data": {}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"
    d.delete_env(b.id)
    assert_gone(denv_server, [parent.id, a.id, b.id])


def _root_proc(d: Denv, env: Env) -> Any:
    from denv.server.docker.live import launcher_ctl

    containers = docker.from_env().containers.list(filters={"label": f"denv.env={env.id}"})
    assert len(containers) == 1, containers
    pid = listening_pid(str(containers[0].id), env.endpoints[0].port)
    start = launcher_ctl.start_time(pid)
    assert start is not None
    return launcher_ctl.Proc(pid, start)


def test_children_keep_the_parents_heap_out_of_collections(
    denv_server: LocalDenv, clients: Clients
) -> None:
    """A child's garbage collections never walk the objects it was forked with (they stay
    frozen there: walking them would copy the whole heap page by page), the parent's own
    collections go on as before, and the parent's heap is backed by huge pages (what makes a
    fork cheap; this kernel has MADV_COLLAPSE)."""
    from denv.server.docker.live import launcher_ctl

    d = clients(denv_server)
    parent = d.create_sandbox(ECHO_IMAGE, live=True)
    child = None
    try:
        assert parent.status.value == "healthy", parent.error
        root = _root_proc(d, parent)
        child = d.fork(parent.id, 1, kind="live").envs[0]
        assert child.status.value == "healthy", child.error
        kid_pid = live_pid(child.id)
        kid = launcher_ctl.Proc(kid_pid, launcher_ctl.start_time(kid_pid) or 0)
        before = launcher_ctl.hello(root)
        assert before["frozen"] == 0, before
        assert launcher_ctl.hello(kid)["frozen"] > 10_000
        # Without `denv serve --merge-pages` nothing is marked for same-page merging
        # (with it: tests/e2e/test_live_merge.py).
        for pid in (root.pid, kid_pid):
            flags = [
                ln
                for ln in Path(f"/proc/{pid}/smaps").read_text().splitlines()
                if ln.startswith("VmFlags:")
            ]
            assert flags and not any(" mg" in f"{ln} " for ln in flags), pid
        if tuple(int(x) for x in os.uname().release.split(".")[:2]) >= (6, 1):
            assert before["huge_kib"] >= 16 * 1024, before
    finally:
        for env in (child, parent):
            if env is not None:
                d.delete_env(env.id)
    assert_gone(denv_server, [parent.id] + ([child.id] if child else []))


def test_a_fork_whose_snapshot_fails_leaves_no_child_and_reopens_the_gate(
    denv_server: LocalDenv, clients: Clients
) -> None:
    """The parent clones its children while the node captures /work; when the capture
    fails, the children are ended before their set-up and the parent serves again."""
    from denv.server.docker.live import launcher_ctl, launcher_fork

    d = clients(denv_server)
    parent = d.create_sandbox(ECHO_IMAGE, live=True)
    try:
        assert parent.status.value == "healthy", parent.error
        root = _root_proc(d, parent)
        kids_before = set(Path(f"/proc/{root.pid}/task/{root.pid}/children").read_text().split())
        specs = [launcher_fork.ChildSpec(f"env_probe{i}", 29000 + i, [], "/tmp") for i in range(3)]

        def failing_snapshot() -> None:
            # The children are cloned meanwhile: each binds its bootstrap socket.
            socks = [Path(launcher_ctl.ctl_path(root.pid, f"{c.env_id}.sock")) for c in specs]
            end = time.monotonic() + 10
            while not all(s.exists() for s in socks) and time.monotonic() < end:
                time.sleep(0.001)
            assert all(s.exists() for s in socks), "the children were not cloned meanwhile"
            raise OSError("the capture failed (on purpose)")

        with pytest.raises(OSError, match="on purpose"):  # not the assert inside
            launcher_fork.fork(root, specs, failing_snapshot, 0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kids = set(Path(f"/proc/{root.pid}/task/{root.pid}/children").read_text().split())
            alive = [
                k
                for k in kids - kids_before
                if launcher_ctl.alive(
                    launcher_ctl.Proc(int(k), launcher_ctl.start_time(int(k)) or -1)
                )
            ]
            zombies = [
                k for k in alive if "Z" in Path(f"/proc/{k}/stat").read_text().split(")")[-1][:3]
            ]
            if len(alive) == len(zombies):
                break
            time.sleep(0.05)
        assert len(alive) == len(zombies), f"children left running: {alive}"
        # The gate is open again: the parent answers.
        with connect(parent.endpoints[0].url.replace("http", "ws", 1) + "/ws") as ws:
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        assert launcher_ctl.hello(root)["pid"]
    finally:
        d.delete_env(parent.id)
    assert_gone(denv_server, [parent.id])


def test_live_refused_with_the_reason(denv_server: LocalDenv, clients: Clients) -> None:
    d = clients(denv_server)
    with pytest.raises(Conflict, match=r"serves an ASGI app with uvicorn") as exc:
        # A Python server, but not an ASGI app under uvicorn: python -m http.server.
        d.create_sandbox("denv-http-standin:latest", live=True)
    assert exc.value.code == "live_unsupported" and "without live" in str(exc.value)
    plain = d.create_sandbox(ECHO_IMAGE)
    try:
        with pytest.raises(Conflict, match="not created with live: true") as exc:
            d.fork(plain.id, 1, kind="live")
        assert "kind: volume" in str(exc.value)
        assert not plain.live
    finally:
        d.delete_env(plain.id)
    assert_gone(denv_server, [plain.id])


def test_conformance_live_mode_on_the_reference_echo_env(denv_server: LocalDenv) -> None:
    """`denv conformance --mode live`: OpenEnv's echo env, unchanged, passes every check;
    its state() is equal across a live fork with no ForkableState."""
    from denv.openenv.conformance import CHECKS, DEFAULT_ACTION, format_table, run_target

    report = run_target(
        ECHO_IMAGE,
        mode="live",
        steps=3,
        branches=3,
        action_template=DEFAULT_ACTION,
        provider_factory=lambda warm, fork: provider(denv_server, warm=warm, fork=fork),
    )
    print(format_table([report]))
    assert [c.name for c in report.checks] == list(CHECKS), format_table([report])
    assert report.passed, format_table([report])


def test_live_children_survive_a_server_restart_and_a_dead_one_is_lost(tmp_path: Path) -> None:
    """Reconcile after a restart keeps live envs whose process runs (their ingress URL
    still works) and marks lost the one whose process was killed meanwhile; deleting
    everything then leaves no container, network or mount."""
    state = tmp_path / "state"
    # detach: the envs outlive this first client and its server (a lease would expire
    # while no server renews it); the second client deletes them
    with start_server(state, cleanup=False) as srv, Denv(srv.url, srv.key, detach=True) as d:
        parent = d.create_sandbox(ECHO_IMAGE, live=True)
        assert parent.status.value == "healthy", parent.error
        a, b = d.fork(parent.id, 2, kind="live").envs
        doomed = live_pid(b.id)
    os.kill(doomed, signal.SIGKILL)  # while the server is down
    with start_server(state) as srv, Denv(srv.url, api_key=srv.key) as d:
        kept = d.get_env(a.id)
        assert kept.status.value == "healthy", kept.error
        with connect(kept.endpoints[0].url.replace("http", "ws", 1) + "/ws") as ws:
            ws.send(json.dumps({"type": "state"}))
            assert json.loads(ws.recv(timeout=30))["type"] == "state"
        lost = d.get_env(b.id)
        assert lost.status.value == "failed" and lost.error and lost.error.code.value == "lost"
        for env_id in (b.id, parent.id, a.id):
            d.delete_env(env_id)
        assert leftovers(state) == {"containers": [], "networks": [], "mounts": [], "cgroups": []}


def _group_container(group: str) -> str:
    found = docker.from_env().containers.list(filters={"label": f"denv.env={group}"})
    assert len(found) == 1, found
    return str(found[0].id)


def test_each_child_has_a_pids_limit_of_its_own(tmp_path: Path) -> None:
    """fork(16) under a pids limit of 16 (the server's --env-pids): every child runs, each
    with 16 pids of its own as its own container would have, the container's limit grows by
    16 per live env, and a deleted child gives its share back."""
    state = tmp_path / "state"
    with start_server(state, "--env-pids", "16") as srv, Denv(srv.url, api_key=srv.key) as d:
        parent = d.create_sandbox(ECHO_IMAGE, live=True)
        assert parent.status.value == "healthy", parent.error
        cid = _group_container(parent.id)
        pids = pids_cgroup(cid)
        children = d.fork(parent.id, 16, kind="live").envs
        assert [c.status.value for c in children] == ["healthy"] * 16, children[0].error
        assert int((pids / "pids.max").read_text()) == 16 * 18  # its own, the root's, 16
        for c in children:
            assert (pids / "denv-live" / c.id / "pids.max").read_text().strip() == "16"
        # (A WebSocket session needs a thread, which a pids limit may refuse: /health.)
        assert all(httpx.get(c.endpoints[0].url + "/health").status_code == 200 for c in children)
        for c in children[1:]:
            d.delete_env(c.id)
        assert int((pids / "pids.max").read_text()) == 16 * 3
        assert not (pids / "denv-live" / children[1].id).exists()
        again = d.fork(children[0].id, 1, kind="live").envs  # a grandchild: the same
        assert again[0].status.value == "healthy", again[0].error
        for e in d.list_envs():
            d.delete_env(e.id)
        assert leftovers(state) == {"containers": [], "networks": [], "mounts": [], "cgroups": []}
