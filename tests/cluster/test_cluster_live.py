"""Live envs on the 3-node local cluster (issue 27, item 5): counted, placed, spilled.

On the session's cluster (conftest: ``denv cluster up``, each node capped at
``CLUSTER_MAX_ENVS`` envs), with OpenEnv's echo env run live by ``DenvProvider()``'s
defaults:

* a live child and a zygote count against their node's cap as any env does: the room the
  cluster reports (the 429 a create past it gets) shrinks by one for each;
* ``fork(n)`` of a live env whose node has room for fewer than n makes as many live
  children as fit there and starts the rest as a volume fork on other nodes; the client
  gets all n ready, and each spilled child's record says why (``Env.spill``);
  ``kind: live`` past the node's room is 429 instead, also after a control-plane restart
  (the live children that outlive it count again);
* a live env is placed on the node with the most room, not where its version's layers are.

The zygotes these creates leave behind are the server's, with no API to delete them; the
module ends by restarting the control plane (a clean stop deletes every zygote) and checks
that the cluster has all its room again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cluster_helpers import LocalCluster
from denv.openenv import DenvProvider
from live_procs import live_pid
from openenv.core import GenericEnvClient

from denv import Denv

pytestmark = pytest.mark.e2e

ECHO_IMAGE = "denv-echo-env:latest"
STANDIN = "denv-http-standin:latest"
STANDIN_CMD = ["sh", "-c", "exec python3 -m http.server 8000 --directory /srv/www"]
ZYGOTE_WAIT_S = 180.0


def total(cluster: LocalCluster) -> int:
    return cluster.max_envs * len(cluster.nodes)


def room_left(api: httpx.Client, cluster: LocalCluster) -> int:
    """The cluster's room as a user finds it: a create of more envs than every node holds is
    refused before anything starts, and the 429 says how many more it has room for."""
    body = {"image": STANDIN, "command": STANDIN_CMD, "count": total(cluster) + 1}
    res = api.post("/v1/sandboxes", json=body)
    assert res.status_code == 429, res.text
    room: int = res.json()["details"]["room"]
    return room


def wait_room(api: httpx.Client, cluster: LocalCluster, want: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        room = room_left(api, cluster)
        if room == want or time.monotonic() > deadline:
            return room
        time.sleep(1)


@pytest.fixture(scope="module")
def api(cluster: LocalCluster) -> Iterator[httpx.Client]:
    """A raw client of the API. At the end: every env of the key deleted, the control plane
    restarted (its zygotes go with its clean stop), and all the room back."""
    headers = {"Authorization": f"Bearer {cluster.api_key}"}
    with httpx.Client(base_url=cluster.url, headers=headers, timeout=300, trust_env=False) as c:
        yield c
        page = c.get("/v1/envs", params={"limit": 200}).json()
        for env in page["items"]:
            if env["status"] != "deleted":
                c.delete(f"/v1/envs/{env['id']}")
        cluster.restart_server()
        assert wait_room(c, cluster, total(cluster), 60) == total(cluster)


@pytest.fixture(scope="module")
def denv(cluster: LocalCluster) -> Iterator[Denv]:
    with Denv(cluster.url, api_key=cluster.api_key) as d:
        yield d


@pytest.fixture(scope="module")
def root(
    cluster: LocalCluster, api: httpx.Client
) -> Iterator[tuple[DenvProvider, GenericEnvClient]]:
    """OpenEnv's echo env started as a user does (``DenvProvider()`` defaults: live where
    the server can be copied), with a session of one step."""
    provider = DenvProvider(server=cluster.url, api_key=cluster.api_key)
    client = GenericEnvClient.from_docker_image(ECHO_IMAGE, provider=provider).sync()
    with client:
        client.reset()
        client.step({"message": "prefix"})
        yield provider, client
    provider.close()


def test_live_children_and_zygotes_count_and_a_full_node_spills(
    cluster: LocalCluster,
    api: httpx.Client,
    denv: Denv,
    root: tuple[DenvProvider, GenericEnvClient],
) -> None:
    provider, _ = root
    parent = denv.get_env(provider.env_id or "")
    assert parent.live and parent.start.value == "cold", parent
    node = parent.node
    # The root, then its zygote (booted behind the first live create): two envs' room.
    assert wait_room(api, cluster, total(cluster) - 2, ZYGOTE_WAIT_S) == total(cluster) - 2

    # Live children run on their parent's node and count there.
    two = denv.fork(parent.id, 2, kind="live").envs
    assert [(e.start.value, e.node, e.spill) for e in two] == [("live", node, None)] * 2
    # Each in a network namespace of its own, as on one machine (`--live-netns on`, the
    # default, reaches the node agents), served at its own address through the node's relay.
    netns = {
        Path(f"/proc/{live_pid(e)}/ns/net").readlink() for e in [parent.id, *(e.id for e in two)]
    }
    assert len(netns) == 3, netns
    for n, env in enumerate(two):
        with GenericEnvClient(base_url=str(env.endpoints[0].url)).sync() as c:
            assert c.step({"message": f"child {n}"}).observation["echoed_message"] == f"child {n}"
    assert room_left(api, cluster) == total(cluster) - 4
    room_there = cluster.max_envs - 3  # the root and two children

    # fork(3) with the defaults: the node has room for one more, so 1 live child and 2
    # volume children on other nodes, from the same version; the client gets all 3 ready.
    children = provider.fork(3)
    envs = [denv.get_env(c.env_id or "") for c in children]
    live = [e for e in envs if e.start.value == "live"]
    spilled = [e for e in envs if e.spill is not None]
    assert len(envs) == 3 and all(e.status.value == "healthy" for e in envs), envs
    assert len(live) == room_there and all(e.node == node and e.spill is None for e in live)
    assert len(spilled) == 3 - room_there, envs
    assert all(e.start.value == "cold" and e.node != node for e in spilled), spilled
    assert all(e.live for e in spilled), spilled  # booted live: each forks live in turn
    assert all(f"node {node}" in (e.spill or "") for e in spilled), spilled
    assert len({e.version_id for e in envs}) == 1 and all(e.parent_id == parent.id for e in envs)
    # A spilled child serves: its server booted on /work as the parent's was at the fork.
    with GenericEnvClient(base_url=children[envs.index(spilled[0])].base_url or "").sync() as c:
        c.reset()
        assert c.step({"message": "spilled"}).observation["echoed_message"] == "spilled"
    assert room_left(api, cluster) == total(cluster) - 7

    # A new control plane counts the live envs that outlive it (its clean stop deleted the
    # zygote): the node is still full.
    cluster.restart_server()
    assert room_left(api, cluster) == total(cluster) - 6

    # Asking for live copies the node has no room for is refused, naming the node.
    res = api.post(f"/v1/envs/{parent.id}/fork", json={"count": 1, "kind": "live"})
    assert res.status_code == 429, res.text
    assert res.json()["code"] == "rate_limited" and f"node {node}" in res.json()["message"]
    assert res.headers.get("Retry-After")

    # Deleting them gives the room back (the live children's too): the root's is left.
    for child in children:
        child.stop_container()
    for env in two:
        denv.delete_env(env.id)
    assert wait_room(api, cluster, total(cluster) - 1, 30) == total(cluster) - 1
    placed = Counter(e.node for e in envs)
    print(
        f"\n  live on a cluster: root and 2 live children on {node}, zygote counted; "
        f"fork(3) -> {dict(placed)} (spilled: {len(spilled)}); counted again after a "
        "control-plane restart; kind live past it: 429"
    )


def test_a_live_env_goes_where_there_is_room_for_its_children(
    cluster: LocalCluster,
    api: httpx.Client,
    denv: Denv,
    root: tuple[DenvProvider, GenericEnvClient],
) -> None:
    provider, _ = root
    parent = denv.get_env(provider.env_id or "")
    version = denv.snapshot(parent.id)  # its layer is on the root's node
    # The root's node holds the version's layers and has room left, the least of any node
    # (a volume env of the version would go there first): a live one goes where there is
    # the most room for the children it will have.
    filler = denv.fork(parent.id, cluster.max_envs - 2, kind="live").envs
    assert {e.node for e in filler} == {parent.node}
    [env] = denv.envs_from_version(version.id, live=True)
    try:
        assert env.live and env.status.value == "healthy", env
        assert env.node != parent.node, (env.node, parent.node)
        print(f"\n  a live env of {version.id} (layers on {parent.node}) placed on {env.node}")
    finally:
        denv.delete_env(env.id)
        for e in filler:
            denv.delete_env(e.id)
