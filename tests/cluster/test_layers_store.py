"""Layers moving between nodes: through a real SeaweedFS (S3) and agent to agent (issue 18).

Each "node" is a ``DockerNode`` on its own state dir, as the node agents run it; the layer
transfer calls touch no container, so nothing here starts one. A node copies a layer from a
peer through the node seam's calls (``layer_digest``, ``read_layer`` chunk by chunk): here the
peers are the other ``DockerNode``s, called in-process where a node agent calls them over Ray
(test_layer_stream.py does that, on the session's cluster). Needs root (overlay mounts).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from cluster_helpers import snapshot_layers, tree_manifest

from denv.cluster import seaweed as sw
from denv.server.config import StoreConfig
from denv.server.docker.engine import Engine
from denv.server.docker.layers import read_ahead
from denv.server.docker.node import DockerNode
from denv.server.node.seam import NodeLost
from denv.server.volumes.layerpack import LayerDigestMismatch, file_digest
from denv.server.volumes.mounts import mount_points_under
from denv.server.volumes.object_store import LayerNotStored, LayerStore, StoreError
from denv.server.volumes.overlay import Volumes

pytestmark = pytest.mark.e2e


def make_node(root: Path, name: str, peers: dict[str, Any] | None = None) -> DockerNode:
    """A node on its own state dir whose peers (for ``copy_layer``) are those of ``peers``."""

    def peer(other: str) -> Any:
        if peers is None or other not in peers:
            raise NodeLost(other, "not a peer of this test")
        return peers[other]

    # The engine is never reached: layer transfer is files and S3 only.
    return DockerNode(Engine(f"h2test-{name}"), Volumes(root / name), peers=peer)


class Flaky:
    """A peer that hands out its layer's chunks damaged (a flipped bit in the first) or
    stops answering after ``fail_after`` chunks: a node lost mid-copy, at the seam where a
    real copy meets Ray (``RemoteNode`` raises this NodeLost when the origin dies)."""

    def __init__(self, node: DockerNode, fail_after: int | None = None) -> None:
        self.node, self.fail_after, self.reads = node, fail_after, 0

    def layer_digest(self, layer_id: str) -> str:
        return self.node.layer_digest(layer_id)

    def read_layer(self, layer_id: str, offset: int, size: int) -> bytes:
        self.reads += 1
        if self.fail_after is not None and offset >= self.fail_after * size:
            raise NodeLost("origin", "its agent died")
        data = self.node.read_layer(layer_id, offset, size)
        return data if offset or self.fail_after is not None else bytes([data[0] ^ 1]) + data[1:]


def leftovers(node: DockerNode) -> list[str]:
    """Half-made layers or downloads a failed transfer would have left."""
    found = [p.name for p in node.volumes.layers_dir.iterdir() if p.name.startswith(".")]
    if node.packed_dir.exists():
        found += [p.name for p in node.packed_dir.iterdir() if ".part-" in p.name]
    return found


def s3(store: StoreConfig) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=store.endpoint,
        aws_access_key_id=store.access_key,
        aws_secret_access_key=store.secret_key,
        region_name=store.region,
    )


def test_a_layer_uploaded_by_one_node_is_fetched_identical_by_another(
    tmp_path: Path, seaweed: StoreConfig
) -> None:
    nodes: dict[str, Any] = {}
    origin, other, peer = (make_node(tmp_path, n, nodes) for n in ("origin", "other", "peer"))
    nodes.update(origin=origin, other=other)
    peer.layers.chunk_bytes = 64 << 10  # many chunks, a few in flight
    base, top = snapshot_layers(origin.volumes)
    layers = LayerStore(seaweed)

    digests = {x: origin.upload_layer(x, seaweed) for x in (base, top)}
    assert digests[top] == origin.layer_digest(top) == file_digest(origin.packed_dir / f"{top}.tar")
    assert layers.digest_of(top) == digests[top]
    head = s3(seaweed).head_object(Bucket=seaweed.bucket, Key=f"layers/{top}.tar")
    assert head["Metadata"]["digest"] == digests[top]
    # Idempotent: stored already with this digest, not uploaded again.
    assert origin.upload_layer(top, seaweed) == digests[top]
    again = s3(seaweed).head_object(Bucket=seaweed.bucket, Key=f"layers/{top}.tar")
    assert again["LastModified"] == head["LastModified"]

    for x in (base, top):
        other.fetch_layer(x, digests[x], seaweed)
        other.fetch_layer(x, digests[x], seaweed)  # a no-op once there
        assert tree_manifest(other.volumes.layer_path(x)) == tree_manifest(
            origin.volumes.layer_path(x)
        )
        packed = origin.packed_dir / f"{x}.tar"
        size = peer.copy_layer(x, "other" if x == top else "origin")  # node to node, no store
        assert size == packed.stat().st_size and peer.copy_layer(x, "origin") == 0
        assert file_digest(peer.packed_dir / f"{x}.tar") == digests[x]
        assert tree_manifest(peer.volumes.layer_path(x)) == tree_manifest(
            origin.volumes.layer_path(x)
        )
    # The fetched node keeps the packed form: it can pass the layer on, same digest.
    assert file_digest(other.packed_dir / f"{top}.tar") == digests[top]
    assert other.read_layer(top, 0, 1 << 20) == origin.read_layer(top, 0, 1 << 20)
    assert other.layer_ids() == origin.layer_ids() == {base, top}

    # Mounted as a volume, the fetched stack shows what the original shows.
    seen = []
    for node in (origin, other, peer):
        mnt = node.volumes.mount("env_view", "agent", 0, [top, base])
        seen.append(sorted(p.relative_to(mnt).as_posix() for p in mnt.rglob("*")))
        assert (mnt / "remade" / "new.txt").read_text() == "new"
        assert not (mnt / "remade" / "hidden.txt").exists()
        assert not (mnt / "deleted.txt").exists()
        node.volumes.remove_env("env_view")
    assert seen[0] == seen[1] == seen[2]
    assert "deleted.txt" not in seen[0] and "kept.txt" in seen[0]
    assert [leftovers(n) for n in (origin, other, peer)] == [[], [], []]

    origin.delete_layers([top])
    assert not (origin.packed_dir / f"{top}.tar").exists()
    layers.delete([base, top, "lyr_neverstored"])
    assert layers.digest_of(top) is None
    with pytest.raises(LayerNotStored, match=top):
        make_node(tmp_path, "late").fetch_layer(top, digests[top], seaweed)
    assert mount_points_under(tmp_path) == []


def test_a_tampered_object_is_refused_with_both_digests(
    tmp_path: Path, seaweed: StoreConfig
) -> None:
    origin, other = make_node(tmp_path, "origin"), make_node(tmp_path, "other")
    _, top = snapshot_layers(origin.volumes, big_bytes=1 << 20)
    digest = origin.upload_layer(top, seaweed)
    tar = (origin.packed_dir / f"{top}.tar").read_bytes()
    tampered = tar[:2048] + bytes([tar[2048] ^ 1]) + tar[2049:]
    client = s3(seaweed)
    client.put_object(
        Bucket=seaweed.bucket, Key=f"layers/{top}.tar", Body=tampered, Metadata={"digest": digest}
    )
    with pytest.raises(LayerDigestMismatch) as err:
        other.fetch_layer(top, digest, seaweed)
    assert digest in str(err.value) and "sha256:" in str(err.value).replace(digest, "")
    assert not other.has_layer(top) and leftovers(other) == []

    # The store's metadata names another digest than the control plane expects.
    client.put_object(
        Bucket=seaweed.bucket, Key=f"layers/{top}.tar", Body=tar, Metadata={"digest": "sha256:0"}
    )
    with pytest.raises(LayerDigestMismatch, match="sha256:0"):
        other.fetch_layer(top, digest, seaweed)
    assert not other.has_layer(top) and leftovers(other) == []

    # A node handed damaged bytes by a peer refuses them too.
    peers = {"origin": Flaky(origin)}
    other = make_node(tmp_path, "other", peers)
    with pytest.raises(LayerDigestMismatch, match="from node origin") as err:
        other.copy_layer(top, "origin")
    assert digest in str(err.value)
    assert not other.has_layer(top) and leftovers(other) == []
    LayerStore(seaweed).delete([top])


def test_a_copy_cut_short_leaves_no_layer_and_names_the_lost_node(tmp_path: Path) -> None:
    origin = make_node(tmp_path, "origin")
    _, top = snapshot_layers(origin.volumes, big_bytes=2 << 20)
    peers: dict[str, Any] = {"origin": Flaky(origin, fail_after=5)}
    other = make_node(tmp_path, "other", peers)
    other.layers.chunk_bytes = 64 << 10
    with pytest.raises(NodeLost) as err:
        other.copy_layer(top, "origin")
    assert err.value.node == "origin" and "its agent died" in str(err.value)
    assert not other.has_layer(top) and leftovers(other) == []
    assert peers["origin"].reads < 5 + 8  # it stopped asking soon after the failure
    with pytest.raises(NodeLost, match="no-such-node"):
        other.copy_layer(top, "no-such-node")
    # A node of no cluster has no peers; and no chunk is ever a whole layer.
    alone = DockerNode(Engine("h2test-alone"), Volumes(tmp_path / "alone"))
    with pytest.raises(NodeLost, match="in no cluster"):
        alone.copy_layer(top, "origin")
    with pytest.raises(ValueError, match="chunk by chunk"):
        origin.read_layer(top, 0, 1 << 30)
    peers["origin"] = origin
    assert other.copy_layer(top, "origin") > 2 << 20
    assert file_digest(other.packed_dir / f"{top}.tar") == origin.layer_digest(top)


def test_read_ahead_hands_out_every_byte_once_in_order() -> None:
    data = os.urandom(10 * 4096 + 123)
    for size in (0, 1, 4095, 4096, 3 * 4096, len(data)):
        calls: list[int] = []

        def read(offset: int, n: int, size: int = size) -> bytes:
            calls.append(offset)
            return data[:size][offset : offset + n]

        chunks = list(read_ahead(read, 4096, 3))
        assert b"".join(chunks) == data[:size], size
        assert all(len(c) == 4096 for c in chunks[:-1]) and all(chunks), size
        assert len(calls) <= size // 4096 + 1 + 3, (size, calls)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_store_that_cannot_serve_says_which_and_what_to_do(
    tmp_path: Path, seaweed: StoreConfig
) -> None:
    node = make_node(tmp_path, "n")
    _, top = snapshot_layers(node.volumes, big_bytes=1 << 10)
    down = seaweed.model_copy(update={"endpoint": f"http://127.0.0.1:{_closed_port()}"})
    with pytest.raises(StoreError, match="does not answer") as err:
        node.upload_layer(top, down)
    assert down.endpoint in str(err.value) and "denv cluster up" in str(err.value)

    wrong_key = seaweed.model_copy(update={"secret_key": "not-the-secret"})
    with pytest.raises(StoreError, match="refused the credentials") as err:
        node.upload_layer(top, wrong_key)
    assert seaweed.endpoint in str(err.value) and "not-the-secret" not in str(err.value)
    assert "not-the-secret" not in repr(wrong_key)

    no_bucket = seaweed.model_copy(update={"bucket": "denv-no-such-bucket"})
    with pytest.raises(StoreError, match="has no such bucket") as err:
        LayerStore(no_bucket).put(top, node.packed_dir / f"{top}.tar", node.layer_digest(top))
    assert "denv-no-such-bucket" in str(err.value) and "ensure_bucket" in str(err.value)
    LayerStore(no_bucket).ensure_bucket()  # creates it; twice is fine
    LayerStore(no_bucket).ensure_bucket()
    assert node.upload_layer(top, no_bucket) == node.layer_digest(top)
    LayerStore(no_bucket).delete([top])
    s3(no_bucket).delete_bucket(Bucket=no_bucket.bucket)


def _listening(pid: int) -> list[str]:
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return [ln.split()[3] for ln in out.splitlines() if f"pid={pid}," in ln]


def test_seaweedfs_listens_on_loopback_only_and_stops_from_another_process(
    tmp_path: Path,
) -> None:
    data = tmp_path / "sw"
    store = sw.start(data)
    state = sw._read_state(data.resolve())
    assert state is not None
    pid, ports = int(state["pid"]), set(state["ports"].values())
    try:
        assert sw.start(data) == store  # already running: the same store, no second one
        addresses = _listening(pid)
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses
        assert {int(a.rsplit(":", 1)[1]) for a in addresses} <= ports
        assert oct((data / "s3.json").stat().st_mode & 0o777) == "0o600"
        LayerStore(store).probe()
        (tmp_path / "l.tar").write_bytes(b"a packed layer")
        LayerStore(store).put("lyr_kept", tmp_path / "l.tar", "sha256:1")
    finally:
        # `denv cluster down` stops it from another process: do the same.
        code = "import sys, pathlib, denv.cluster.seaweed as s; s.stop(pathlib.Path(sys.argv[1]))"
        subprocess.run([sys.executable, "-c", code, str(data)], check=True)
        sw._children.pop(pid, None)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        os.waitpid(pid, os.WNOHANG)  # our child: reap it
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()
    assert sw.running(data) is None
    assert [
        p for p in Path("/tmp").glob("seaweedfs-*.sock") if int(p.stem.rsplit("-", 1)[1]) in ports
    ] == []

    # Started again on its data (other ports, same keys): the stored layers are there.
    again = sw.start(data)
    assert (again.access_key, again.secret_key) == (store.access_key, store.secret_key)
    assert LayerStore(again).digest_of("lyr_kept") == "sha256:1"
    # Killed (a crash): stop() still removes what it left, and purge its data.
    state = sw._read_state(data.resolve())
    assert state is not None
    os.kill(int(state["pid"]), 9)
    os.waitpid(int(state["pid"]), 0)
    sw.stop(data, purge=True)
    assert not data.exists() and sw.running(data) is None
    ports = set(state["ports"].values())
    assert [
        p for p in Path("/tmp").glob("seaweedfs-*.sock") if int(p.stem.rsplit("-", 1)[1]) in ports
    ] == []
