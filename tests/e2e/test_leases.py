"""End to end (issue 25 item 1, issue 26 item 2): a client's envs live while the client does.

On a server of its own (its containers are counted), with live forks of one live root the
module makes detached: each fork takes milliseconds, so a trainer of 32 envs costs no boots.

* a trainer process SIGKILLed with 32 envs and a warm spare: all gone within 30 s, each
  env's record saying its lease expired;
* a client paused (SIGSTOP) past its lease: its envs go, and its next fork raises
  `LeaseExpired` naming the lease;
* a network blip shorter than the lease (a loopback proxy that stops forwarding 3 s of a
  6 s lease): nothing lost;
* closing a client, or a script's exit without closing, deletes its envs at once; detached
  envs stay; a provider's envs, forks and async forks are held by its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import LocalDenv, clean, instance_id, start_server
from provider_helpers import ECHO_IMAGE

from denv import AsyncDenv, DeletionReason, Denv, EnvStatus, LeaseState

pytestmark = pytest.mark.e2e

TRAINER = Path(__file__).with_name("lease_trainer.py")
LEASE_BOUND_S = 30.0  # the bound: renewals stop -> every env gone


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-leases")) as srv:
        yield srv


@pytest.fixture(scope="module")
def admin(server: LocalDenv) -> Iterator[Denv]:
    """A detached client: what it makes stays until deleted; it reads everyone's envs."""
    with Denv(server.url, server.key, detach=True) as client:
        yield client


@pytest.fixture(scope="module")
def root(admin: Denv) -> Iterator[str]:
    """One live root: every lease test's envs are its live forks."""
    env = admin.create_sandbox(ECHO_IMAGE, live=True)
    assert env.status == EnvStatus.HEALTHY and env.lease_id is None, env.error
    yield env.id
    admin.delete_env(env.id)


def containers(server: LocalDenv) -> set[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=denv.instance={instance_id(server.state_dir)}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def wait_deleted(admin: Denv, ids: list[str], within_s: float) -> float:
    """Seconds until every env of `ids` is deleted; fails after `within_s`."""
    t0 = time.monotonic()
    left = set(ids)
    while left:
        left = {i for i in left if admin.get_env(i).status != EnvStatus.DELETED}
        elapsed = time.monotonic() - t0
        assert elapsed <= within_s, f"{len(left)} env(s) still there after {elapsed:.1f} s"
        if left:
            time.sleep(0.25)
    return time.monotonic() - t0


def read_json_line(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, object]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"the trainer said nothing in {timeout_s} s"
    line = proc.stdout.readline()
    assert line, f"the trainer exited ({proc.poll()}) without a word"
    value: dict[str, object] = json.loads(line)
    return value


def trainer(server: LocalDenv, root: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(TRAINER), server.url, server.key, root, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_killed_trainer_leaves_nothing_within_30_s(
    server: LocalDenv, admin: Denv, root: str
) -> None:
    before = containers(server)
    proc = trainer(server, root, "kill")
    try:
        said = read_json_line(proc, 240)
    finally:
        proc.kill()  # SIGKILL: no atexit, no close: only the lease can clean up
        proc.wait()
    killed = time.monotonic()
    warm = str(said["warm"])
    envs = [*(str(e) for e in said["envs"]), warm]  # type: ignore[attr-defined]
    assert len(envs) == 33  # 32 live forks, and an env that asked for a warm spare
    assert {admin.get_env(e).lease_id for e in envs} == {said["lease"]}
    assert admin.warm_pool(warm).state == "ready", "the trainer was killed before its spare"
    assert len(containers(server) - before) == 2  # the warm env and its spare
    wait_deleted(admin, envs, LEASE_BOUND_S - (time.monotonic() - killed))
    waited = time.monotonic() - killed
    print(f"32 live forks, a warm env and its spare gone {waited:.1f} s after SIGKILL")
    for env_id in envs:
        deletion = admin.get_env(env_id).deletion
        assert deletion is not None and deletion.reason == DeletionReason.LEASE_EXPIRED
        assert str(said["lease"]) in deletion.message
    # The spare had no record of its own: it went with the env that asked for it.
    deadline = time.monotonic() + 10
    while containers(server) != before and time.monotonic() < deadline:
        time.sleep(0.25)
    assert containers(server) == before
    assert admin.get_env(root).status == EnvStatus.HEALTHY  # detached: untouched


def test_a_client_paused_past_its_lease_loses_its_envs_and_is_told(
    server: LocalDenv, admin: Denv, root: str
) -> None:
    proc = trainer(server, root, "pause")
    try:
        said = read_json_line(proc, 60)
        envs = [str(e) for e in said["envs"]]  # type: ignore[attr-defined]
        os.kill(proc.pid, signal.SIGSTOP)
        wait_deleted(admin, envs, LEASE_BOUND_S)  # its lease is 5 s
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        told = read_json_line(proc, 30)
    finally:
        proc.kill()
        proc.wait()
    assert told["error"] == "LeaseExpired", told
    message = str(told["message"])
    assert str(said["lease"]) in message and "expired" in message and "paused" in message
    assert all(admin.get_env(e).deletion.reason == "lease_expired" for e in envs)  # type: ignore[union-attr]


class PausableProxy:
    """A TCP proxy on loopback to `target`; `pause()` stops it forwarding (bytes wait) until
    `flowing` is set. `seen` lists the requests that reached it: (when, the request's first
    line); `held` those that came while it was stopped (seconds since the stop, the line)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.flowing = threading.Event()
        self.flowing.set()
        self.stopped = False
        self.seen: list[tuple[float, str]] = []
        self.held: list[tuple[float, str]] = []
        self._paused_at = 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    def pause(self) -> None:
        self._paused_at = time.monotonic()
        self.flowing.clear()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b, ask in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, ask), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(65536):
                if requests:
                    line, now = data.split(b"\r\n", 1)[0].decode("latin-1"), time.monotonic()
                    self.seen.append((now, line))
                    if not self.flowing.is_set():
                        self.held.append((now - self._paused_at, line))
                self.flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.stopped = True
        self.flowing.set()
        self.listener.close()


def wait_for_request(proxy: PausableProxy, path: str, after: float, within_s: float) -> float:
    """When the first request for `path` after `after` reached the proxy."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        times = [t for t, line in proxy.seen if path in line and t > after]
        if times:
            return times[0]
        time.sleep(0.02)
    raise AssertionError(f"no request for {path} within {within_s} s: {proxy.seen}")


def test_a_network_blip_shorter_than_the_lease_loses_nothing(
    server: LocalDenv, admin: Denv, root: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="denv")
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    proxy = PausableProxy((host, int(port)))
    try:
        with Denv(proxy.url, server.key, lease_timeout_s=6) as denv:
            envs = [e.id for e in denv.fork(root, 2, kind="live").envs]
            # Renewals come every 2 s (a third of the lease) and give up after 1 s. The blip
            # begins 1 s after one: the next is held from about 1 s in, fails inside the
            # blip, and its retries wait for the blip's end. (Begun just as a renewal is due
            # instead, a renewal held from 2 s in could be answered as the blip ends.)
            renewed = wait_for_request(proxy, "/renew ", after=time.monotonic(), within_s=5)
            time.sleep(max(0.0, renewed + 1 - time.monotonic()))
            proxy.pause()  # nothing gets through for 3 s, half the 6 s lease
            time.sleep(3)
            proxy.flowing.set()
            time.sleep(6.5)  # past the lease: an expiry would have happened by now
            held = [t for t, line in proxy.held if "/renew " in line]
            assert held and held[0] < 2, f"no renewal failed in the blip: {proxy.held}"
            failed = [r for r in caplog.records if "renewing lease" in r.getMessage()]
            assert failed, "the client did not say a renewal failed"
            assert all(admin.get_env(e).status == EnvStatus.HEALTHY for e in envs)
            lease = denv.lease()
            assert lease is not None and lease.state == LeaseState.OPEN and lease.envs == 2
            assert denv.fork(root, 1, kind="live").envs[0].status == EnvStatus.HEALTHY
        wait_deleted(admin, envs, 5)  # closed: at once
    finally:
        proxy.close()


def test_closing_deletes_at_once_and_detached_envs_stay(admin: Denv, root: str) -> None:
    with Denv(admin.server, admin._key) as denv:  # the same key
        held = [e.id for e in denv.fork(root, 3, kind="live").envs]
        kept = denv.fork(root, 1, kind="live").envs[0]
        assert denv.detach(kept.id).lease_id is None
    wait_deleted(admin, held, 5)
    assert {admin.get_env(e).deletion.reason for e in held} == {"lease_closed"}  # type: ignore[union-attr]
    assert admin.get_env(kept.id).status == EnvStatus.HEALTHY
    admin.delete_env(kept.id)
    assert admin.get_env(kept.id).deletion.reason == "requested"  # type: ignore[union-attr]

    async def held_by_an_async_client() -> list[str]:
        async with AsyncDenv(admin.server, admin._key) as client:
            fork = await client.fork(root, 2, kind="live")
            assert {e.lease_id for e in fork.envs} == {client.lease_id}
            return [e.id for e in fork.envs]

    wait_deleted(admin, asyncio.run(held_by_an_async_client()), 5)


def test_a_script_that_exits_without_closing_leaves_nothing(
    server: LocalDenv, admin: Denv, root: str
) -> None:
    script = (
        "import sys; from denv import Denv\n"
        "d = Denv(sys.argv[1], sys.argv[2])\n"
        "print(' '.join(e.id for e in d.fork(sys.argv[3], 2, kind='live').envs))\n"
        "raise SystemExit(3)  # no close(): the interpreter's exit closes the lease\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, server.url, server.key, root],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    envs = done.stdout.split()
    assert len(envs) == 2
    wait_deleted(admin, envs, 2)  # at once, not after the lease's 15 s
    assert {admin.get_env(e).deletion.reason for e in envs} == {"lease_closed"}  # type: ignore[union-attr]


def test_a_providers_envs_and_forks_are_held_by_its_lease(server: LocalDenv, admin: Denv) -> None:
    from denv.openenv import DenvProvider

    provider = DenvProvider(server=server.url, api_key=server.key, fork="live")
    url = provider.start_container(ECHO_IMAGE)
    provider.wait_for_ready(url)
    branches = provider.fork(2)
    async_branch = asyncio.run(provider.fork_async())
    ids = [p.env_id for p in (provider, *branches, async_branch)]
    leases = {admin.get_env(str(i)).lease_id for i in ids}
    assert len(leases) == 1 and None not in leases
    branches[0].detach()
    assert admin.get_env(str(branches[0].env_id)).lease_id is None
    for p in (provider, *branches, async_branch):
        p.close()
    wait_deleted(admin, [str(i) for i in ids], 5)


def test_providers_one_after_another_share_one_lease_until_it_idles(
    server: LocalDenv, admin: Denv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer that makes a provider per env (start, stop, again) opens one client and one
    lease for all of them, not one each (a request to open and one to close per env); the
    lease closes once no provider has held it for `IDLE_KEEP_S`, and the next provider then
    opens a new one."""
    from denv.openenv import DenvProvider, _connection

    monkeypatch.setattr(_connection, "IDLE_KEEP_S", 1.0)
    leases = []
    for _ in range(2):
        provider = DenvProvider(server=server.url, api_key=server.key)
        provider.wait_for_ready(provider.start_container(ECHO_IMAGE))
        leases.append(admin.get_env(str(provider.env_id)).lease_id)
        provider.close()
    assert leases[0] is not None and leases == [leases[0]] * 2, leases
    headers = {"Authorization": f"Bearer {server.key}"}
    deadline = time.monotonic() + 10
    while (state := lease_state(server, leases[0], headers)) == "open":
        assert time.monotonic() < deadline, "the idle lease is still open after 10 s"
        time.sleep(0.25)
    assert state == "closed", state
    provider = DenvProvider(server=server.url, api_key=server.key)
    try:
        provider.wait_for_ready(provider.start_container(ECHO_IMAGE))
        assert admin.get_env(str(provider.env_id)).lease_id not in (None, leases[0])
    finally:
        provider.close()


def lease_state(server: LocalDenv, lease_id: str, headers: dict[str, str]) -> str:
    res = httpx.get(f"{server.url}/v1/leases/{lease_id}", headers=headers, timeout=10)
    res.raise_for_status()
    return str(res.json()["state"])


def test_a_server_stopping_expires_no_lease(tmp_path: Path) -> None:
    """While a stopping server drains (up to 5 s of requests in flight) it refuses every new
    connection, renewals too: no lease may expire then. Its next start gives each open lease
    its timeout again, so a client that outlives the restart keeps its envs.

    Found by the long soak (bench/soak_long.py): a trainer's create, answered during the
    drain, came back with its env already deleted (`lease_expired`)."""
    state = tmp_path / "state"
    port = str(_free_port())
    with start_server(state, "--port", port, cleanup=False) as srv:
        client = Denv(srv.url, srv.key, lease_timeout_s=5)
        env = client.create_sandbox(
            "denv-http-standin:latest",
            command=["python3", "-m", "http.server", "8000", "--directory", "/srv/www"],
        )
        assert env.status == EnvStatus.HEALTHY, env.error

        # A long-poll in flight keeps the drain going for its full 5 s, past the lease's 5 s
        # since its last renewal.
        def long_poll() -> None:
            with contextlib.suppress(Exception), Denv(srv.url, srv.key, detach=True) as other:
                other.wait_env(env.id, "deleted", timeout_s=30)

        threading.Thread(target=long_poll, daemon=True).start()
        time.sleep(1)
    try:
        with start_server(state, "--port", port, cleanup=False) as srv:
            with Denv(srv.url, srv.key, detach=True) as admin:
                got = admin.get_env(env.id)
                assert got.status != EnvStatus.DELETED, got.deletion
                assert client.lease() is not None and client.lease().state == LeaseState.OPEN
            client.close()
    finally:
        clean(state)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
