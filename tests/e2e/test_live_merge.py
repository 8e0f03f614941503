"""End to end: ``denv serve --merge-pages``, live envs' memory merged by the kernel (KSM).

One server of its own, started with the flag, and one live echo env forked twice; each
child steps through ingress with a real OpenEnv client, which copies most of the pages it
touches (reference counts moved and put back). With ``ksmd`` paused, each child's private
memory is measured; then ``ksmd`` runs full scans and the same children hold less than half
of it (measured: ~16.5 MB, then ~2.5 MB), still answer their steps, and keep their own
state. The server turned merging on at its start when it was off. The machine's KSM
settings are put back afterwards; without the flag, a live child's memory is never marked
(tests/e2e/test_live_fork.py checks that).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import Clients, LocalDenv, start_server
from openenv.core import GenericEnvClient
from provider_helpers import ECHO_IMAGE, assert_gone, live_pid, message, state_of

from denv.server.docker import ksm

pytestmark = pytest.mark.e2e

KSM = Path("/sys/kernel/mm/ksm")
SETTINGS = ("run", "pages_to_scan", "sleep_millisecs")
SCANS_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def ksm_settings() -> Iterator[dict[str, str]]:
    """The host's KSM settings as found, put back after the module (merging off again if it
    was: pages already merged stay so until their processes end, which is at the deletes)."""
    saved = {name: (KSM / name).read_text().strip() for name in SETTINGS}
    (KSM / "run").write_text("0\n")  # so that the server has it to turn on
    try:
        yield saved
    finally:
        for name in ("pages_to_scan", "sleep_millisecs", "run"):
            (KSM / name).write_text(saved[name] + "\n")


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, ksm_settings: dict[str, str]
) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-merge"), "--merge-pages") as srv:
        yield srv


def private_kib(pid: int) -> int:
    """What the process holds alone (USS): private pages, clean or dirty; a merged page is
    shared, so it leaves this count."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total


def merge_marked(pid: int) -> bool:
    """Whether the process's heap carries the mergeable mark (``mg`` in its VmFlags)."""
    in_heap = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if line[0].isdigit() or line[0] in "abcdef":  # a mapping's header
            in_heap = line.endswith("[heap]")
        elif in_heap and line.startswith("VmFlags:"):
            return "mg" in line.split()[1:]
    raise AssertionError(f"no [heap] mapping in process {pid}")


def full_scans(n: int) -> None:
    """Let ``ksmd`` run until it has gone over every marked page ``n`` more times (a page is
    merged on the scan after the one that first saw its twin)."""
    start = ksm.stats()["full_scans"]
    (KSM / "pages_to_scan").write_text("1000\n")  # the test's pace; the host's is put back
    (KSM / "sleep_millisecs").write_text("20\n")
    (KSM / "run").write_text("1\n")
    deadline = time.monotonic() + SCANS_TIMEOUT_S
    while ksm.stats()["full_scans"] < start + n:
        assert time.monotonic() < deadline, f"ksmd made no {n} full scans in {SCANS_TIMEOUT_S}s"
        time.sleep(0.5)


def test_children_copies_are_merged_back_and_still_serve(
    server: LocalDenv, ksm_settings: dict[str, str], clients: Clients
) -> None:
    assert (KSM / "run").read_text().strip() == "1", "the server did not turn merging on"
    d = clients(server)
    parent = d.create_sandbox(ECHO_IMAGE, live=True)
    ids = [parent.id]
    stack = ExitStack()
    try:
        assert parent.status.value == "healthy", parent.error
        (KSM / "run").write_text("0\n")  # paused: the children's copies, measured unmerged
        children = d.fork(parent.id, 2, kind="live").envs
        ids += [c.id for c in children]
        pids = {c.id: live_pid(c.id) for c in children}
        clients = {}
        for n, child in enumerate(children):
            assert child.status.value == "healthy", child.error
            assert merge_marked(pids[child.id]), "a child's heap is not marked mergeable"
            client = stack.enter_context(GenericEnvClient(base_url=child.endpoints[0].url).sync())
            clients[child.id] = client
            client.reset()
            observation = dict(client.step(message(f"child {n}")).observation)
            assert observation["echoed_message"] == f"child {n}"
        unmerged = {c.id: private_kib(pids[c.id]) for c in children}

        full_scans(3)
        merged = {c.id: private_kib(pids[c.id]) for c in children}
        for env_id in merged:
            assert merged[env_id] < unmerged[env_id] / 2, (unmerged, merged)
        assert ksm.stats()["pages_sharing"] > 0

        # A merged page is read-only: a child writing to it gets a copy of its own, so the
        # children go on stepping apart (their own step counts, their own echoes).
        for n, child in enumerate(children):
            client = clients[child.id]
            for k in range(n + 1):
                observation = dict(client.step(message(f"child {n} again {k}")).observation)
                assert observation["echoed_message"] == f"child {n} again {k}"
            assert state_of(client)["step_count"] == 1 + n + 1
    finally:
        stack.close()
        for env_id in reversed(ids):
            d.delete_env(env_id)
    assert_gone(server, ids)
