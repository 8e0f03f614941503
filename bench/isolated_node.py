"""Prototype (issue 27, item 1): ONE cluster node that shares nothing with the host but the
kernel and the disk, brought up, measured, killed as a machine dies, and torn down.

    sudo .venv/bin/python -m bench.isolated_node [--image denv-http-standin:latest] [--out DIR]

The topology it builds (names carry a short id ``<id>``; every one is removed at the end,
also when a step fails):

    host netns                      lan netns  dvc<id>-lan           node netns  dvc<id>-n0
    control plane, Ray head   veth  bridge br0 (no host iptables:    veth eth0 10.231.K.10/24
    at 10.231.K.1/24  <-------------> a fresh netns forwards) <-----> dockerd (own data root,
                                                                      exec root, socket,
                                                                      pidfile, bridge dnb0,
                                                                      iptables), Ray worker
                                                                      at 10.231.K.10

- The lan is a netns of its own holding the bridge, so that bridged traffic between nodes
  never crosses the host's FORWARD chain (policy DROP under Docker, br_netfilter on): no
  rule is added to the host's iptables.
- The node's processes (dockerd, its containerd, the shims, the containers, the Ray node)
  all sit in one cgroup of the unified hierarchy ``dvc<id>-n0``: ``cgroup.kill`` on it is the
  machine's death, containers included.
- The node's dockerd has no images: the image is copied from the shared daemon
  (``docker save | docker load``), which is the step that costs.

Phases are timed with ``time.monotonic`` and written to ``<out>/isolated_node.json`` and
``.md``; checks (the node's Ray node advertises its own address, a container of the node is
not on the shared engine and not reachable from the host, the kill takes the containers)
fail the run when they do not hold.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from denv.cluster import ray_auth
from denv.cluster.processes import free_port, session_pids, spawn, stop_session, tail
from denv.cluster.ray_nodes import (
    HEALTH_ENV,
    agent_ports,
    quiet_head_env,
    ray_command,
    wait_gcs,
)

log = logging.getLogger("bench.isolated_node")

LAN_POOL = ipaddress.ip_network("10.231.0.0/16")  # one /24 per cluster, none routed already
NODE_BRIDGE_NET = "172.30.0.1/24"  # inside the node's netns only: may repeat across nodes
BRIDGE_PREFIX = 24
UNIFIED = Path("/sys/fs/cgroup/unified")  # cgroup2 (hybrid host); /sys/fs/cgroup when pure v2
DOCKERD_START_S = 60.0
RAY_JOIN_S = 120.0


def sh(*cmd: str, ns: str | None = None, check: bool = True, **kw: Any) -> str:
    argv = ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return str(done.stdout)


def free_lan() -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A /24 of LAN_POOL that no route of the host overlaps."""
    routed = [
        ipaddress.ip_network(line.split()[0], strict=False)
        for line in sh("ip", "-4", "route").splitlines()
        if line and line.split()[0] != "default"
    ]
    for net in LAN_POOL.subnets(new_prefix=24):
        if not any(net.overlaps(r) for r in routed):
            return net
    raise RuntimeError(f"no free /24 in {LAN_POOL}")


def cgroup_root() -> Path:
    return UNIFIED if UNIFIED.is_dir() else Path("/sys/fs/cgroup")


class IsolatedNode:
    """One node: its netns, veth, cgroup, dockerd and Ray worker (see the module's doc)."""

    def __init__(self, cid: str, name: str, lan: str, address: str, root: Path) -> None:
        self.name, self.lan, self.address, self.root = name, lan, address, root
        self.ns = f"dvc{cid}-{name}"
        self.cgroup = cgroup_root() / self.ns
        self.exec_root = Path(f"/run/{self.ns}")  # short: containerd's socket paths
        self.sock = root / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.ray_sid: int | None = None
        self.relay_sid: int | None = None

    def netns(self, prefix_len: int, gateway: str) -> None:
        sh("ip", "netns", "add", self.ns)
        lan_side = f"{self.ns[:10]}l"  # IFNAMSIZ: 15
        sh("ip", "link", "add", lan_side, "netns", self.lan, "type", "veth", "peer", "name",
           "eth0", "netns", self.ns)  # fmt: skip
        sh("ip", "link", "set", lan_side, "master", "br0", "up", ns=self.lan)
        sh("ip", "link", "set", "lo", "up", ns=self.ns)
        sh("ip", "addr", "add", f"{self.address}/{prefix_len}", "dev", "eth0", ns=self.ns)
        sh("ip", "link", "set", "eth0", "up", ns=self.ns)
        sh("ip", "route", "add", "default", "via", gateway, ns=self.ns)
        self.cgroup.mkdir()

    def start_in_cgroup(self, cmd: list[str], log_path: Path, env: dict[str, str]) -> int:
        """``cmd`` in the node's netns and cgroup, a session of its own; its pid."""
        # nsenter, not `ip netns exec`: that one remounts /sys in a mount namespace of its
        # own, where dockerd finds no cgroup hierarchies.
        wrapper = (
            f'echo $$ > {self.cgroup}/cgroup.procs && exec nsenter --net=/run/netns/{self.ns} "$@"'
        )
        return spawn(["sh", "-c", wrapper, "sh", *cmd], log_path, env)

    def dockerd(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # A bridge of its own inside the node's netns (never --bridge=none: a dockerd given
        # that deleted the shared daemon's docker0 once).
        sh("ip", "link", "add", "dnb0", "type", "bridge", ns=self.ns)
        sh("ip", "addr", "add", NODE_BRIDGE_NET, "dev", "dnb0", ns=self.ns)
        sh("ip", "link", "set", "dnb0", "up", ns=self.ns)
        cmd = [
            "dockerd",
            f"--host={self.host}",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.root / 'dockerd.pid'}",
            "--bridge=dnb0",
            "--iptables=true",  # the node netns's own tables
            f"--cgroup-parent=/{self.ns}",
        ]
        self.dockerd_sid = self.start_in_cgroup(cmd, self.root / "dockerd.log", {})
        deadline = time.monotonic() + DOCKERD_START_S
        while (
            sh("docker", "-H", self.host, "version", check=False, timeout=30).count("Server") == 0
        ):
            if not session_pids(self.dockerd_sid) or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the node's dockerd did not come up: {tail(self.root / 'dockerd.log')}"
                )
            time.sleep(0.1)

    def load_image(self, image: str) -> None:
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        assert save.stdout is not None
        load = subprocess.run(
            ["docker", "-H", self.host, "load", "-q"],
            stdin=save.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
        save.stdout.close()
        if save.wait() != 0 or load.returncode != 0:
            raise RuntimeError(f"docker save {image} | docker load: {load.stderr.strip()}")

    def ray_worker(self, gcs: str, token: Path, ray_tmp: Path) -> None:
        ray_tmp.mkdir(parents=True, exist_ok=True)
        resources = json.dumps({"denv_node": 1, f"denv_node_{self.name}": 1})
        cmd = [
            *ray_command(), "start", "--block", "--disable-usage-stats", "--num-cpus=1",
            "--object-store-memory=100000000", f"--temp-dir={ray_tmp}", f"--resources={resources}",
            *agent_ports(), "--min-worker-port=0", "--max-worker-port=0",
            f"--address={gcs}", f"--node-ip-address={self.address}",
        ]  # fmt: skip
        env = {**HEALTH_ENV, **ray_auth.process_env(token), "DOCKER_HOST": self.host}
        self.ray_sid = self.start_in_cgroup(cmd, self.root / "ray.log", env)

    def relay(self, token: Path) -> int:
        """The node's ingress relay (``denv.cluster.relay``, as its node agent runs it) on
        the node's address, opening the node bridge's containers only; its port."""
        port = free_port()
        bridge = str(ipaddress.ip_network(NODE_BRIDGE_NET, strict=False))
        script = (
            "import threading; from denv.cluster import ray_auth; "
            "from denv.cluster.relay import Relay, env_addresses; "
            f"r = Relay(ray_auth.relay_key(), env_addresses({bridge!r}, {BRIDGE_PREFIX})); "
            f"r.start({self.address!r}, {port}); print('relay up', flush=True); "
            "threading.Event().wait()"
        )
        log_path = self.root / "relay.log"
        self.relay_sid = self.start_in_cgroup(
            [sys.executable, "-c", script], log_path, ray_auth.process_env(token)
        )
        deadline = time.monotonic() + 60
        while "relay up" not in log_path.read_text(errors="replace"):
            if not session_pids(self.relay_sid) or time.monotonic() > deadline:
                raise RuntimeError(f"the node's relay did not start: {tail(log_path)}")
            time.sleep(0.1)
        return port

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self) -> None:
        """The machine's death: every process of the node's cgroup, containers included."""
        if not self.cgroup.is_dir():
            return
        kill_file = self.cgroup / "cgroup.kill"
        if kill_file.exists():
            kill_file.write_text("1")
        else:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)

    def remove(self) -> list[str]:
        """Kill, unmount, delete; what could not be removed, one line each."""
        left: list[str] = []
        self.kill()
        for sid in (getattr(self, "dockerd_sid", None), self.ray_sid, self.relay_sid):
            if sid is not None:  # the sh wrappers' sessions (and zombies) of this process
                stop_session(sid, grace_s=1.0)
        for prefix in (str(self.root), str(self.exec_root)):
            for point in reversed(mounts_under(prefix)):
                sh("umount", "-l", point, check=False)
        # Docker made a cgroup per container under --cgroup-parent (in every hierarchy).
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / self.ns
            if top.is_dir():
                for d in sorted(top.glob("**/"), key=lambda d: len(d.parts), reverse=True):
                    with contextlib.suppress(OSError):
                        d.rmdir()
        sh("ip", "netns", "del", self.ns, check=False)  # its veth's pair goes with it
        shutil.rmtree(self.exec_root, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)
        left += [
            f"mount {m}" for p in (str(self.root), str(self.exec_root)) for m in mounts_under(p)
        ]
        left += [f"cgroup {c}" for c in Path("/sys/fs/cgroup").glob(f"*/{self.ns}")]
        left += [f"netns {self.ns}"] if self.ns in sh("ip", "netns", "list") else []
        left += [f"dir {d}" for d in (self.root, self.exec_root) if d.exists()]
        return left


def mounts_under(prefix: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return sorted(p for p in points if p == prefix or p.startswith(prefix + "/"))


class Lan:
    """The cluster's switch: a netns with bridge br0, and the host's veth into it."""

    def __init__(self, cid: str, net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> None:
        self.ns = f"dvc{cid}-lan"
        self.net = net
        self.host_if = f"dvc{cid}h"
        self.gateway = str(net.network_address + 1)

    def up(self) -> None:
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", "br0", "type", "bridge", ns=self.ns)
        sh("ip", "link", "set", "br0", "up", ns=self.ns)
        sh(
            "ip",
            "link",
            "add",
            self.host_if,
            "type",
            "veth",
            "peer",
            "name",
            "up0",
            "netns",
            self.ns,
        )
        sh("ip", "link", "set", "up0", "master", "br0", "up", ns=self.ns)
        sh("ip", "addr", "add", f"{self.gateway}/{self.net.prefixlen}", "dev", self.host_if)
        sh("ip", "link", "set", self.host_if, "up")

    def remove(self) -> list[str]:
        sh("ip", "link", "del", self.host_if, check=False)
        sh("ip", "netns", "del", self.ns, check=False)
        left = [f"netns {self.ns}"] if self.ns in sh("ip", "netns", "list") else []
        left += [f"link {self.host_if}"] if Path(f"/sys/class/net/{self.host_if}").exists() else []
        return left


def start_head(work: Path, address: str, token: Path) -> tuple[int, str]:
    port = free_port()
    cmd = [
        *ray_command(), "start", "--head", "--block", "--disable-usage-stats", "--num-cpus=0",
        "--object-store-memory=100000000", f"--temp-dir={work / 'ray-head'}", f"--port={port}",
        f"--node-ip-address={address}", "--include-dashboard=false",
        *agent_ports(), "--min-worker-port=0", "--max-worker-port=0",
    ]  # fmt: skip
    env = {**HEALTH_ENV, **ray_auth.process_env(token), **quiet_head_env(work)}
    sid = spawn(cmd, work / "ray-head.log", env)
    return sid, f"{address}:{port}"


def wait_node(
    gcs: str, token: Path, head_ip: str, name: str, address: str, timeout_s: float = RAY_JOIN_S
) -> dict[str, Any]:
    import ray

    from denv.cluster import ray_cluster

    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(ConnectionError):
            if not ray.is_initialized():
                ray_auth.use_token(token)
                # This process sits on the head's machine: its raylet is the head's, at the
                # lan address (the host's own address would match no raylet).
                ray.init(address=gcs, _node_ip_address=head_ip, logging_level=logging.WARNING)
            for node in ray_cluster.denv_nodes():
                if node.name == name and node.alive:
                    return {"name": node.name, "ip": node.ip}
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"Ray node {name} ({address}) did not join {gcs} in {timeout_s:.0f} s"
            )
        time.sleep(0.2)


async def _get_through(key: bytes, relay: str, ip: str, port: int) -> str:
    """The status line of ``GET /`` at ``ip:port`` through ``relay``, or the relay's error."""
    from denv.server.ingress.relay import RelayError, open_socket

    loop = asyncio.get_running_loop()
    try:
        sock = await open_socket(key, relay, ip, port)
    except RelayError as exc:
        return f"RelayError: {exc}"
    try:
        await loop.sock_sendall(sock, b"GET / HTTP/1.0\r\nHost: env\r\n\r\n")
        answer = b""
        while chunk := await loop.sock_recv(sock, 65536):
            answer += chunk
        return answer.split(b"\r\n", 1)[0].decode("latin-1")
    finally:
        sock.close()


def run(image: str, work: Path) -> dict[str, Any]:
    cid = secrets.token_hex(3)
    lan = Lan(cid, free_lan())
    node = IsolatedNode(cid, "n0", lan.ns, str(lan.net.network_address + 10), work / "n0")
    token = ray_auth.create_token_file(work / "ray-token")
    phases: dict[str, float] = {}
    checks: dict[str, Any] = {}
    head_sid: int | None = None
    left: list[str] = []

    def phase(name: str, started: float) -> None:
        phases[name] = round(time.monotonic() - started, 3)
        log.info("%s: %.2f s", name, phases[name])

    try:
        t0 = time.monotonic()
        lan.up()
        phase("lan_s", t0)
        head_sid, gcs = start_head(work, lan.gateway, token)
        head = {"name": "head", "sid": head_sid, "log": str(work / "ray-head.log")}
        wait_gcs({"nodes": [head], "head": "head", "address": gcs})  # ClusterError if it exits
        t = time.monotonic()
        node.netns(lan.net.prefixlen, lan.gateway)
        phase("netns_veth_cgroup_s", t)
        t = time.monotonic()
        node.dockerd()
        phase("dockerd_s", t)
        t = time.monotonic()
        node.load_image(image)
        phase("image_load_s", t)
        size = sh("docker", "image", "inspect", image, "--format", "{{.Size}}").strip()
        checks["image_mb"] = round(int(size) / 1e6, 1)
        t = time.monotonic()
        node.ray_worker(gcs, token, Path(f"/tmp/dvc{cid}-ray"))
        seen = wait_node(gcs, token, lan.gateway, node.name, node.address)
        phase("ray_join_s", t)
        phases["node_up_s"] = round(sum(v for k, v in phases.items() if k != "lan_s"), 3)
        checks["ray_node_ip"] = seen["ip"]
        assert seen["ip"] == node.address, (
            f"the Ray node advertises {seen['ip']}, not {node.address}"
        )
        # A container on the node's engine: not on the shared engine, not reachable from here.
        t = time.monotonic()
        cid_ = sh(
            "docker",
            "-H",
            node.host,
            "run",
            "-d",
            "--rm",
            image,
            "python3",
            "-m",
            "http.server",
            "8000",
        ).strip()
        phase("first_container_s", t)
        ip = sh("docker", "-H", node.host, "inspect", cid_, "--format",
                "{{.NetworkSettings.IPAddress}}").strip()  # fmt: skip
        shared = sh("docker", "ps", "-q", "--no-trunc").split()
        checks["container_on_shared_engine"] = cid_ in shared
        # Never probed from here (the address may be routed outward): the host's route to
        # it must not lead into the cluster's lan, the only way to the node.
        route = sh("ip", "-4", "route", "get", ip)
        checks["container_ip"] = ip
        checks["host_route_to_container"] = route.strip()
        checks["container_reachable_from_host"] = lan.host_if in route
        deadline = time.monotonic() + 20
        while True:  # from inside the node: its own engine's bridge
            code = sh("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "2",
                      f"http://{ip}:8000/", ns=node.ns, check=False)  # fmt: skip
            if code == "200" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        checks["container_answers_in_node"] = code
        # From the host, as the control plane: the container only through the node's relay
        # at the node's address, with the cluster's key; without it, refused.
        t = time.monotonic()
        relay = f"{node.address}:{node.relay(token)}"
        phase("relay_start_s", t)
        key = ray_auth.relay_key(token.read_text().strip())
        assert key is not None
        checks["container_through_relay"] = asyncio.run(_get_through(key, relay, ip, 8000))
        checks["relay_without_key"] = asyncio.run(
            _get_through(secrets.token_bytes(32), relay, ip, 8000)
        )
        # The machine dies: its engine and containers with it.
        before = len(node.pids())
        t = time.monotonic()
        node.kill()
        phase("kill_s", t)
        checks["node_processes_killed"] = before
        checks["processes_left_after_kill"] = len(node.pids())
    finally:
        t = time.monotonic()
        left += node.remove()
        if head_sid is not None:
            from denv.cluster import ray_cluster

            ray_cluster.disconnect()
            stop_session(head_sid, grace_s=2.0)
        left += lan.remove()
        keep = os.environ.get("DENV_ISOLATED_KEEP_LOGS")  # a dir: the node's Ray logs go there
        if keep:
            for logs in Path(f"/tmp/dvc{cid}-ray").glob("session_2*/logs"):
                shutil.copytree(logs, Path(keep) / logs.parent.name, dirs_exist_ok=True)
        shutil.rmtree(f"/tmp/dvc{cid}-ray", ignore_errors=True)
        shutil.rmtree(work / "ray-head", ignore_errors=True)
        phases["teardown_s"] = round(time.monotonic() - t, 3)
    checks["left_after_teardown"] = left
    problems = []
    if checks["container_on_shared_engine"] or checks["container_reachable_from_host"]:
        problems.append("the node's container is visible from the host")
    if checks["container_answers_in_node"] != "200":
        problems.append("the node's container did not answer on the node's bridge")
    if not str(checks.get("container_through_relay")).startswith("HTTP/1.0 200"):
        problems.append("the node's container did not answer through the node's relay")
    if "refused the control plane's relay key" not in str(checks.get("relay_without_key")):
        problems.append("the node's relay did not refuse a client without the key")
    if checks["processes_left_after_kill"]:
        problems.append("processes outlived the node's kill")
    if left:
        problems.append(f"teardown left {left}")
    return {"image": image, "phases": phases, "checks": checks, "problems": problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.isolated_node")
    parser.add_argument("--image", default="denv-http-standin:latest")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        print("bench.isolated_node: needs root and dockerd", file=sys.stderr)
        return 2
    work = Path(f"/tmp/denv-isolated-{os.getpid()}")
    work.mkdir(mode=0o700)
    try:
        result = run(args.image, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_avg"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "isolated_node.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# One isolated node (bench/isolated_node.py)", "", "| phase | s |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in result["phases"].items()]
    lines += ["", "checks: `" + json.dumps(result["checks"]) + "`", ""]
    (args.out / "isolated_node.md").write_text("\n".join(lines))
    print(json.dumps(result, indent=2))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
