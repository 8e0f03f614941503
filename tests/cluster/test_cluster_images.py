"""Images on the nodes of a cluster (issue 27, item 4), on the session's cluster.

Two images of this module's own (the stand-in image plus a label of a random token, so each
has an id nothing else uses) go the whole way a user's image goes:

- created as sandboxes, each is saved into the object store by the cluster, once;
- then removed from every engine, as if every node that had it were gone: a new sandbox of
  the same name is started all the same, on a node that lacked it, from the store (by its
  name's record there, and fetched by its id);
- the node collects what it brought under a budget: with a budget of 0, the image no
  container uses is removed, the one a running env uses is kept, and nothing else of the
  engine (images this node did not bring) is touched;
- an image nowhere to be found (collected, and deleted from the store) fails the env made
  from its version, with a message naming the image and the node; a new sandbox of its name
  is refused naming the image and the nodes asked.

On the shared engine (CI's session cluster) every node sees the same engine, so the copy
from node to node is shown by ``test_isolated_nodes.py``; here the store's path is.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cluster_helpers import LocalCluster

from denv.cluster import local, ray_cluster
from denv.server.volumes.image_store import ImageStore

pytestmark = pytest.mark.e2e

BASE = "denv-http-standin:latest"  # built by `make images`
CMD = ["python3", "-m", "http.server", "8000", "--directory", "/srv/www"]
STORED_WAIT_S = 180.0  # a 190 MB image saved and uploaded in the background, on a busy machine


def _engines(cluster: LocalCluster) -> list[list[str]]:
    """A docker command prefix per engine the cluster's nodes use (one, when shared)."""
    if not cluster.isolated:
        return [["docker"]]
    return [cluster.docker(n) for n in cluster.nodes]


def _run(cmd: list[str], stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(cmd, input=stdin, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def images(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two images of this module's own on this machine's engine (and, on isolated nodes, in
    the first node's engine only); removed from every engine and the store at the end."""
    token = secrets.token_hex(4)
    refs = [f"denv-test-image-{token}:{i}" for i in (1, 2)]
    work = tmp_path_factory.mktemp("images")
    ids: list[str] = []
    try:
        for ref in refs:
            (work / "Dockerfile").write_text(f"FROM {BASE}\nLABEL denv.test.image={ref}\n")
            built = _run(["docker", "build", "-q", "-t", ref, str(work)])
            assert built.returncode == 0, built.stderr.decode()
            ids.append(built.stdout.decode().strip())
            if cluster.isolated:
                saved = _run(["docker", "save", ref])
                loaded = _run([*cluster.docker(cluster.nodes[0]), "load"], saved.stdout)
                assert loaded.returncode == 0, loaded.stderr.decode()
        yield refs
    finally:
        for prefix in [["docker"], *_engines(cluster)]:
            _run([*prefix, "rmi", "-f", *refs, *ids])
        if cluster.store is not None and ids:
            store = ImageStore(cluster.store)
            store.delete(ids)
            for ref in refs:
                store.delete_ref(ref)


@pytest.fixture
def api(cluster: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=cluster.url,
        headers={"Authorization": f"Bearer {cluster.api_key}"},
        timeout=300,
        trust_env=False,
    ) as c:
        yield c


def _image_id(prefix: list[str], ref: str) -> str | None:
    found = _run([*prefix, "image", "inspect", "--format", "{{.Id}}", ref])
    return found.stdout.decode().strip() if found.returncode == 0 else None


def _has(cluster: LocalCluster, node: str, image_id: str) -> bool:
    prefix = cluster.docker(node) if cluster.isolated else ["docker"]
    return _image_id(prefix, image_id) == image_id


def _brought(cluster: LocalCluster, node: str) -> dict[str, float]:
    path = cluster.dir / "nodes" / node / "images.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _sandbox(api: httpx.Client, ref: str) -> dict[str, Any]:
    res = api.post("/v1/sandboxes", json={"image": ref, "command": CMD})
    assert res.status_code == 201, res.text
    env: dict[str, Any] = res.json()
    assert env["status"] == "healthy", env
    return env


def _wait_stored(store: ImageStore, refs: list[str], image_ids: list[str]) -> None:
    """Until each image is in the store, and its name recorded there."""
    deadline = time.monotonic() + STORED_WAIT_S
    while True:
        missing = [i for i in image_ids if store.digest_of(i) is None]
        missing += [r for r in refs if store.ref(r) is None]
        if not missing:
            return
        assert time.monotonic() < deadline, f"not saved into the store: {missing}"
        time.sleep(1.0)


def test_images_come_from_the_store_are_collected_and_missing_ones_name_image_and_node(
    cluster: LocalCluster, api: httpx.Client, images: list[str]
) -> None:
    assert cluster.store is not None, "the session cluster runs with its SeaweedFS"
    store = ImageStore(cluster.store)
    unused_ref = images[1]
    made: list[str] = []
    try:
        # 1. First use: found on a node, saved into the store once, in the background.
        first = [_sandbox(api, ref) for ref in images]
        made += [e["id"] for e in first]
        ids = [e["services"][0]["image_digest"] for e in first]
        used_id, unused_id = ids
        _wait_stored(store, images, ids)
        for e in first:
            assert api.delete(f"/v1/envs/{e['id']}").status_code in (200, 204)
        # 2. Every node loses both: a sandbox of each name starts on a node that lacked it.
        for prefix in _engines(cluster):
            gone = _run([*prefix, "rmi", "-f", *images])
            assert gone.returncode == 0, gone.stderr.decode()
        assert not any(_has(cluster, n, i) for n in cluster.nodes for i in ids)
        again = [_sandbox(api, ref) for ref in images]
        made += [e["id"] for e in again]
        for env, image_id in zip(again, ids, strict=True):
            assert env["services"][0]["image_digest"] == image_id
            assert _has(cluster, env["node"], image_id), f"{image_id} not on {env['node']}"
            assert image_id in _brought(cluster, env["node"]), "not recorded as brought"
        used_env, unused_env = again
        version = api.post(f"/v1/envs/{unused_env['id']}/snapshot")
        assert version.status_code in (200, 201), version.text
        unused_version = version.json()["id"]
        assert api.delete(f"/v1/envs/{unused_env['id']}").status_code in (200, 204)

        # 3. A budget of 0: the unused image goes, the running env's stays, nothing else.
        ray_cluster.connect(cluster.address, cluster.ray_token)
        agents = ray_cluster.discover(local.agent_config(cluster.dir, cluster.max_envs))
        removed = [i for n in agents.values() for i in n.collect_images(0, 0.0)]
        assert removed == [unused_id], removed  # only what a node brought, and unused
        assert not _has(cluster, unused_env["node"], unused_id)
        assert _has(cluster, used_env["node"], used_id)
        assert _image_id(["docker"], BASE), "the image both were built on was removed"
        step = api.get(f"/v1/envs/{used_env['id']}")
        assert step.json()["status"] == "healthy", step.text

        # 4. Nowhere to be found: the env from its version fails naming image and node.
        store.delete([unused_id])
        store.delete_ref(unused_ref)
        res = api.post(f"/v1/versions/{unused_version}/envs", json={"count": 1})
        assert res.status_code in (200, 201), res.text
        child = res.json()["envs"][0]
        made.append(child["id"])
        deadline = time.monotonic() + 120
        while child["status"] not in ("failed", "healthy") and time.monotonic() < deadline:
            time.sleep(0.5)
            child = api.get(f"/v1/envs/{child['id']}").json()
        assert child["status"] == "failed", child
        message = child["error"]["message"]
        assert unused_ref in message, message
        assert any(f"node {n} " in message for n in cluster.nodes), message
        # A new sandbox of that name is refused before anything starts, naming it.
        refused = api.post("/v1/sandboxes", json={"image": unused_ref, "command": CMD})
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "image_not_found"
        assert unused_ref in refused.json()["message"]
        print(
            f"images: stored, fetched on {used_env['node']} and {unused_env['node']}; "
            f"collected {sorted(removed)}; missing: {message}"
        )
    finally:
        for env_id in made:
            api.delete(f"/v1/envs/{env_id}")
