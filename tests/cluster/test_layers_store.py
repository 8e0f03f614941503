"""Layers moving between nodes: through a real SeaweedFS (S3) and agent to agent (issue 18).

Each "node" is a ``DockerNode`` on its own state dir, as the node agents run it; the layer
transfer calls touch no container, so nothing here starts one. A node copies a layer from a
peer by taking the peer's offer (``offer_layer``: a port on 127.0.0.1 here that streams the
packed file) and reading it over TCP: the peers are the other ``DockerNode``s, asked in-process
where a node agent asks over Ray (the cluster tests' cross-node forks do that). Needs root
(overlay mounts).
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
from denv.server.config import ObjectStoreConfig
from denv.server.docker.engine import Engine
from denv.server.docker.node import DockerNode
from denv.server.node.seam import LayerOffer, NodeLost
from denv.server.volumes.layerpack import LayerDigestMismatch, file_digest
from denv.server.volumes.mounts import mount_points_under
from denv.server.volumes.object_store import LayerNotInObjectStore, LayerStore, ObjectStoreError
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
    """A peer whose offer is not what its node offers: a wrong digest (damaged on its way),
    or more bytes than its port sends (the origin died mid-stream). A fault injected at the
    seam where a real copy meets Ray, the offer record."""

    def __init__(self, node: DockerNode, **change: Any) -> None:
        self.node, self.change = node, change

    def offer_layer(self, layer_id: str) -> LayerOffer:
        offer = self.node.offer_layer(layer_id)
        return offer.model_copy(update={k: v(offer) for k, v in self.change.items()})


def leftovers(node: DockerNode) -> list[str]:
    """Half-made layers or downloads a failed transfer would have left."""
    found = [p.name for p in node.volumes.layers_dir.iterdir() if p.name.startswith(".")]
    if node.packed_dir.exists():
        found += [p.name for p in node.packed_dir.iterdir() if ".part-" in p.name]
    return found


def s3(store: ObjectStoreConfig) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=store.endpoint,
        aws_access_key_id=store.access_key,
        aws_secret_access_key=store.secret_key,
        region_name=store.region,
    )


def test_a_layer_uploaded_by_one_node_is_fetched_identical_by_another(
    tmp_path: Path, seaweed: ObjectStoreConfig
) -> None:
    nodes: dict[str, Any] = {}
    origin, other, peer = (make_node(tmp_path, n, nodes) for n in ("origin", "other", "peer"))
    nodes.update(origin=origin, other=other)
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
    assert other.offer_layer(top).digest == origin.offer_layer(top).digest == digests[top]
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
    with pytest.raises(LayerNotInObjectStore, match=top):
        make_node(tmp_path, "late").fetch_layer(top, digests[top], seaweed)
    assert mount_points_under(tmp_path) == []


def test_a_tampered_object_is_refused_with_both_digests(
    tmp_path: Path, seaweed: ObjectStoreConfig
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
    peers = {"origin": Flaky(origin, digest=lambda o: "sha256:" + "0" * 64)}
    other = make_node(tmp_path, "other", peers)
    with pytest.raises(LayerDigestMismatch, match="from node origin") as err:
        other.copy_layer(top, "origin")
    assert digest in str(err.value) and "0" * 64 in str(err.value)
    assert not other.has_layer(top) and leftovers(other) == []
    LayerStore(seaweed).delete([top])


def test_a_copy_cut_short_leaves_no_layer_and_names_the_lost_node(tmp_path: Path) -> None:
    origin = make_node(tmp_path, "origin")
    _, top = snapshot_layers(origin.volumes, big_bytes=2 << 20)
    peers: dict[str, Any] = {"origin": Flaky(origin, size=lambda o: o.size + 4096)}
    other = make_node(tmp_path, "other", peers)
    with pytest.raises(NodeLost) as err:
        other.copy_layer(top, "origin")
    assert err.value.node == "origin" and "stream" in str(err.value), err.value
    assert not other.has_layer(top) and leftovers(other) == []
    # An offer whose port is gone (its node died before the taker came).
    peers["origin"] = Flaky(origin, address=lambda o: f"127.0.0.1:{_closed_port()}")
    with pytest.raises(NodeLost, match="origin is lost: streaming"):
        other.copy_layer(top, "origin")
    with pytest.raises(NodeLost, match="no-such-node"):
        other.copy_layer(top, "no-such-node")
    assert not other.has_layer(top) and leftovers(other) == []
    # A node of no cluster has no peers.
    alone = DockerNode(Engine("h2test-alone"), Volumes(tmp_path / "alone"))
    with pytest.raises(NodeLost, match="in no cluster"):
        alone.copy_layer(top, "origin")
    peers["origin"] = origin
    assert other.copy_layer(top, "origin") > 2 << 20
    assert file_digest(other.packed_dir / f"{top}.tar") == origin.layer_digest(top)


def test_an_offer_streams_to_the_token_holder_only(tmp_path: Path) -> None:
    origin = make_node(tmp_path, "origin")
    _, top = snapshot_layers(origin.volumes, big_bytes=1 << 20)
    offer = origin.offer_layer(top)
    assert offer.token not in repr(offer)
    host, port = offer.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"\0" * 32)  # a wrong token: dropped, nothing sent
        assert s.recv(1) == b""
    # The offer stands for its taker.
    peers: dict[str, Any] = {"origin": Flaky(origin)}
    peers["origin"].offer_layer = lambda layer_id: offer
    other = make_node(tmp_path, "other", peers)
    assert other.copy_layer(top, "origin") == offer.size
    # Taken once: the port is closed.
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=10).close()


BIG_LAYER = 256 << 20  # far more than any buffer of a transfer; cheap enough for CI
MEMORY_BOUND = 64 << 20  # a quarter of it: what a move may add to the peak resident memory


def _rss() -> dict[str, int]:
    status = Path("/proc/self/status").read_text().splitlines()
    return {
        k: int(v.split()[0]) << 10
        for k, _, v in (ln.partition(":") for ln in status)
        if k in ("VmRSS", "VmHWM")
    }


def _peak_growth(move: Any) -> int:
    """How much ``move()`` raised this process's peak resident memory (VmHWM, reset first)."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _rss()["VmRSS"]
    move()
    return _rss()["VmHWM"] - before


def test_a_layer_far_bigger_than_any_buffer_moves_in_bounded_memory(
    tmp_path: Path, seaweed: ObjectStoreConfig
) -> None:
    """Node to node (offer, TCP stream, check, unpack), node to store and store to node,
    each both ends in this one process: its peak memory grows by far less than the layer."""
    nodes: dict[str, Any] = {}
    origin, peer, other = (make_node(tmp_path, n, nodes) for n in ("origin", "peer", "other"))
    nodes["origin"] = origin
    layer, tmp = origin.volumes.new_layer_dir()
    block = os.urandom(8 << 20)
    for i in range(BIG_LAYER // len(block)):  # 32 files of 8 MiB, each its own bytes
        (tmp / f"f{i:02d}").write_bytes(i.to_bytes(4) + block[4:])
    origin.volumes.publish(layer, tmp)
    LayerStore(seaweed).digest_of(layer)  # boto3 loaded before the measures: not a transfer's

    grown = {"pack": _peak_growth(lambda: origin.layer_digest(layer))}
    digest = origin.layer_digest(layer)
    grown["node_to_node"] = _peak_growth(lambda: peer.copy_layer(layer, "origin"))
    grown["node_to_store"] = _peak_growth(lambda: origin.upload_layer(layer, seaweed))
    grown["store_to_node"] = _peak_growth(lambda: other.fetch_layer(layer, digest, seaweed))
    print(
        f"\n  peak RSS growth moving a {BIG_LAYER >> 20} MiB layer, MiB: "
        + ", ".join(f"{k} {v / (1 << 20):.1f}" for k, v in grown.items())
    )

    for node in (peer, other):
        assert file_digest(node.packed_dir / f"{layer}.tar") == digest
        assert tree_manifest(node.volumes.layer_path(layer)) == tree_manifest(
            origin.volumes.layer_path(layer)
        )
    assert all(v < MEMORY_BOUND for v in grown.values()), grown
    assert [leftovers(n) for n in (origin, peer, other)] == [[], [], []]
    LayerStore(seaweed).delete([layer])
    for node in (origin, peer, other):
        node.delete_layers([layer])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_store_that_cannot_serve_says_which_and_what_to_do(
    tmp_path: Path, seaweed: ObjectStoreConfig
) -> None:
    node = make_node(tmp_path, "n")
    _, top = snapshot_layers(node.volumes, big_bytes=1 << 10)
    down = seaweed.model_copy(update={"endpoint": f"http://127.0.0.1:{_closed_port()}"})
    with pytest.raises(ObjectStoreError, match="does not answer") as err:
        node.upload_layer(top, down)
    assert down.endpoint in str(err.value) and "denv cluster up" in str(err.value)

    wrong_key = seaweed.model_copy(update={"secret_key": "not-the-secret"})
    with pytest.raises(ObjectStoreError, match="refused the credentials") as err:
        node.upload_layer(top, wrong_key)
    assert seaweed.endpoint in str(err.value) and "not-the-secret" not in str(err.value)
    assert "not-the-secret" not in repr(wrong_key)

    no_bucket = seaweed.model_copy(update={"bucket": "denv-no-such-bucket"})
    with pytest.raises(ObjectStoreError, match="has no such bucket") as err:
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
