"""Helpers shared by the cluster tests (import as ``from cluster_helpers import ...``)."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cluster_nodes

from denv.server.config import ObjectStoreConfig
from denv.server.volumes.overlay import Volumes

Entry = tuple[str, int, int, int, int, str, tuple[tuple[str, bytes], ...]]


def tree_manifest(root: Path) -> list[Entry]:
    """Every entry under ``root`` (itself as "."), sorted: name, mode (with the type), owner,
    group, mtime (ns; 0 for symlinks), what it holds (content hash prefix, size and link
    count; a link's target; a device's numbers) and its xattrs. Two dirs with the same
    manifest hold the same tree."""
    out: list[Entry] = []
    for dirpath, dirnames, filenames in os.walk(root):
        names = ([] if dirpath != str(root) else ["."]) + sorted(dirnames + filenames)
        for name in names:
            path = dirpath if name == "." else os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                what = f"{Path(path).read_bytes().hex()[:64]}/{st.st_size}/{st.st_nlink}"
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                what = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            else:
                what = ""
            xattrs = tuple(
                (a, os.getxattr(path, a, follow_symlinks=False))
                for a in sorted(os.listxattr(path, follow_symlinks=False))
            )
            mtime = 0 if stat.S_ISLNK(st.st_mode) else st.st_mtime_ns
            rel = os.path.relpath(path, root)
            out.append((rel, st.st_mode, st.st_uid, st.st_gid, mtime, what, xattrs))
    return sorted(out)


def snapshot_layers(vols: Volumes, big_bytes: int = 3 << 20) -> tuple[str, str]:
    """Two layers made as snapshots make them: a base, and over it the upper dir of an env
    that deleted a file (a whiteout), deleted and remade a dir (opaque), and wrote files,
    links, a FIFO, a setuid file of another owner and an xattr. (base, top) layer ids."""
    seed = vols.layers_dir.parent / "seed"
    (seed / "gone_dir").mkdir(parents=True)
    (seed / "gone_dir" / "old.txt").write_text("old")
    (seed / "remade").mkdir()
    (seed / "remade" / "hidden.txt").write_text("hidden by an opaque dir")
    (seed / "deleted.txt").write_text("deleted above")
    (seed / "kept.txt").write_text("kept")
    base = vols.capture(seed)
    assert base is not None
    env = "env_h2snap"
    mnt = vols.mount(env, "agent", 0, [base])
    try:
        (mnt / "deleted.txt").unlink()
        subprocess.run(["rm", "-rf", str(mnt / "gone_dir"), str(mnt / "remade")], check=True)
        (mnt / "remade").mkdir()
        (mnt / "remade" / "new.txt").write_text("new")
        (mnt / "big.bin").write_bytes(os.urandom(big_bytes))
        (mnt / "sub" / "deeper").mkdir(parents=True)
        (mnt / "sub" / "deeper" / "f").write_text("deep")
        os.link(mnt / "sub" / "deeper" / "f", mnt / "hardlink")
        os.symlink("/etc/passwd", mnt / "abs_link")
        os.symlink("../kept.txt", mnt / "sub" / "rel_link")
        os.mkfifo(mnt / "fifo")
        (mnt / "setuid").write_text("#!/bin/sh\n")
        os.chown(mnt / "setuid", 1234, 4321)
        os.chmod(mnt / "setuid", 0o4755)
        os.setxattr(mnt / "kept.txt", "user.note", b"\xff\x00binary")
        top = vols.capture(vols.upper(env, "agent", 0))
        assert top is not None
    finally:
        vols.remove_env(env)
    return base, top


# The local Ray cluster (H3): what the session fixture `cluster` (conftest) yields.
@dataclass
class LocalCluster:
    """A cluster started by ``denv cluster up``: Ray nodes, agents, SeaweedFS, server."""

    url: str
    api_key: str
    dir: Path
    address: str  # the Ray head's GCS
    nodes: list[str]  # ["n0", "n1", "n2"]
    head: str  # "n0": never killed (the cluster ends with it)
    ray_token: Path  # the file holding the token every Ray process of it joins with
    max_envs: int  # the per-node cap the server got (--node-max-envs)
    store: ObjectStoreConfig | None
    up_stdout: str = ""  # what `denv cluster up` printed (the export lines)
    isolated: dict[str, Any] | None = None  # `up --isolated`: its topology (``isolation``)

    def docker(self, node: str, *args: str) -> list[str]:
        """A ``docker`` command for node ``node``'s engine (this machine's, when shared)."""
        if not self.isolated:
            return ["docker", *args]
        from denv.cluster import isolation

        return ["docker", "-H", isolation.docker_host(self.isolated["nodes"][node]), *args]

    def on_node(self, node: str, *cmd: str) -> list[str]:
        """``cmd`` run where node ``node``'s network is: its namespace, when isolated."""
        if not self.isolated:
            return list(cmd)
        return ["ip", "netns", "exec", self.isolated["nodes"][node]["netns"], *cmd]

    def kill_node(self, name: str) -> None:
        """Kill Ray node ``name`` as a machine dies (SIGKILL to its raylet, then the rest)."""
        cluster_nodes.kill_node(self.dir, name)

    def restart_node(self, name: str) -> None:
        """Start Ray node ``name`` again (same name and state dir); returns once Ray sees it."""
        cluster_nodes.restart_node(self.dir, name)

    def restart_server(self) -> None:
        """Stop ``denv serve --cluster`` (SIGTERM) and start it again on the same URL; returns
        once it answers."""
        from denv.cluster import local

        local.restart_server(self.dir)

    def instance_ids(self) -> dict[str, str]:
        """Node name -> the instance id its agent labels Docker objects with."""
        root = self.dir / "nodes"
        return {
            d.name: (d / "instance").read_text().strip()
            for d in sorted(root.iterdir())
            if (d / "instance").exists()
        }


def cluster_leftovers(cluster_dir: Path, instance_ids: list[str], sessions: list[int]) -> list[str]:
    """What a stopped cluster left: processes of its sessions (Ray nodes, server, store),
    containers and networks of its nodes' instances, mounts under its dir, Ray temp dirs."""
    from denv.cluster import processes

    left = [
        f"process {pid} of session {sid}" for sid in sessions for pid in processes.session_pids(sid)
    ]
    for inst in instance_ids:
        label = f"label=denv.instance={inst}"
        for kind, cmd in (("container", ["ps", "-aq"]), ("network", ["network", "ls", "-q"])):
            out = subprocess.run(
                ["docker", *cmd, "--filter", label], capture_output=True, text=True, check=False
            ).stdout
            left += [f"{kind} {x} of instance {inst}" for x in out.split()]
    root = str(cluster_dir.resolve())
    with open("/proc/self/mountinfo") as f:
        left += [f"mount {ln.split()[4]}" for ln in f if ln.split()[4].startswith(root + "/")]
    return left


def cluster_sessions(cluster_dir: Path) -> list[int]:
    """The session ids of every process group ``up`` started (from cluster.json)."""
    from denv.cluster import processes

    state = processes.read_state(cluster_dir) or {}
    sessions = [int(n["sid"]) for n in state.get("nodes", [])]
    if state.get("ray_head"):  # an isolated cluster's head (this machine's own Ray node)
        sessions.append(int(state["ray_head"]["sid"]))
    for node in state.get("isolated", {}).get("nodes", {}).values():  # their engines
        sessions += [int(node["engine_sid"])] if node.get("engine_sid") else []
    if state.get("server"):
        sessions.append(int(state["server"]["sid"]))
    return sessions


def grpc_call_answered(
    address: str,
    method: str,
    token: str | None,
    timeout_s: float = 10,
    tls: ssl.SSLContext | None = None,
) -> bool:
    """Make one unary gRPC call (an empty request message) to ``address`` ("host:port") over
    HTTP/2 (over TLS with ``tls``, else in clear), as any gRPC client would, with
    ``authorization: Bearer <token>`` when ``token`` is given. True when the server answered
    with a message, False when it ended the call with headers alone (an error status, such
    as UNAUTHENTICATED).

    Written out by hand because grpcio is no dependency of denv; the request's headers are
    HPACK literals, the answer is told apart by its frame types, never decoded."""

    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        head = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
        return head + payload

    def literal(name: str, value: str) -> bytes:  # "literal without indexing, new name"
        n, v = name.encode(), value.encode()
        assert len(n) < 127 and len(v) < 127, "longer strings need HPACK's multi-byte lengths"
        return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v

    host, port = address.rsplit(":", 1)
    headers = [
        (":method", "POST"),
        (":scheme", "https" if tls is not None else "http"),
        (":path", method),
        (":authority", address),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] + ([("authorization", f"Bearer {token}")] if token else [])
    block = b"".join(literal(n, v) for n, v in headers)
    request = b"\x00" + (0).to_bytes(4, "big")  # not compressed, 0 bytes: an empty message
    settings, headers_end, end_stream, ack = 4, 0x4, 0x1, 0x1
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.create_connection((host, int(port)), timeout=timeout_s))
        if tls is not None:
            sock = stack.enter_context(tls.wrap_socket(sock, server_hostname=host))
        sock.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + frame(settings, 0, 0, b"")
            + frame(1, headers_end, 1, block)  # HEADERS
            + frame(0, end_stream, 1, request)  # DATA
        )
        reader = sock.makefile("rb")
        answered = False
        while True:
            head = reader.read(9)
            assert len(head) == 9, f"{address} closed the connection mid-call"
            size, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
            stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            payload = reader.read(size)
            if kind == settings and not flags & ack:
                sock.sendall(frame(settings, ack, 0, b""))
            assert kind != 7, f"{address} refused the connection (GOAWAY)"
            if stream != 1:
                continue
            assert kind != 3, f"{address} reset the call (RST_STREAM)"
            answered = answered or (kind == 0 and len(payload) >= 5)  # a message came back
            if kind in (0, 1) and flags & end_stream:
                return answered


def standin_boot(agent: Any, timeout_s: float) -> Any:
    """A ``BootSpec`` for a node agent run in this process (``NodeAgent``): the stand-in
    image serving /health, egress deny, one empty /work."""
    from denv.server import ids
    from denv.server.node.seam import BootSpec
    from denv.server.records import ServiceSpec, VolumeSlot

    image = "denv-http-standin:latest"
    service = ServiceSpec(
        name="agent",
        image=image,
        image_digest=agent.call("inspect_image", image, False).id,
        command=["python3", "-m", "http.server", "8000", "--directory", "/srv/www"],
        ports=[8000],
        volumes=["/work"],
        health_path="/health",
    )
    return BootSpec(
        env_id=ids.new_id("env"),
        services=[service],
        agent="agent",
        egress="deny",
        volumes=[VolumeSlot(service="agent", n=0, path="/work", layers=[])],
        timeout_s=timeout_s,
    )
