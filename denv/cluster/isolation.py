"""Nodes that share nothing, on one machine: ``denv cluster up --isolated``.

Each node of an isolated local cluster is made to look to the control plane as another
machine would:

- its own network namespace ``denv-<tag>-<name>``, joined to this machine by a veth pair on
  one host bridge ``dnb<tag>``; the node has an address on the bridge's subnet, and this
  machine (the control plane, the Ray head, SeaweedFS) is the bridge's gateway address;
- its own Docker Engine, run inside that namespace: its own data root under
  ``<cluster dir>/engines/<name>``, exec root, socket and pidfile under
  ``/tmp/denv-e<tag>-<name>`` (unix socket paths must be short), its own ``docker0`` (a
  subnet of its own), its own iptables (those of its namespace) and the cgroup parent
  ``denv-<tag>-<name>``;
- its Ray node, started inside that namespace on the node's address, with ``DOCKER_HOST``
  naming the node's engine (its agent's engine, the relay on the node's address).

Everything a node runs (its Ray processes, dockerd, containerd, the shims and the
containers) sits in the freezer cgroup ``denv-<tag>-<name>``, so ``kill_node`` takes it all
down as a machine's death does: frozen, SIGKILLed, the engine's mounts undone, the namespace
deleted (and its veth with it). The engine's data root stays, as a dead machine's disk does:
a node started again (``ray_nodes.start_engine``, as the cluster tests' restart does) boots on
it, its images already loaded.

The host bridge's traffic between nodes crosses this machine's FORWARD chain when
``br_netfilter`` is loaded (Docker's policy there is DROP), so one rule lets the bridge's own
traffic through; ``remove`` deletes it with the bridge. What was made is recorded in the
cluster's state (``state["isolated"]``) before it is made, so ``denv cluster down`` removes
it even after a failed ``up``.

A node's Docker Engine and the images copied into it are in ``isolated_engine``.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from .processes import ClusterError

CGROUP_ROOT = Path("/sys/fs/cgroup")
FREEZER = CGROUP_ROOT / "freezer"
NETNS_DIR = Path("/run/netns")
KILL_WAIT_S = 10.0
# Candidate /20 blocks for a cluster's addresses: the host bridge's /24 first, then one /24
# per node for its engine's docker0. Clear of Docker's defaults (172.17+, 192.168) and of
# denv's env pool (10.213.0.0/16).
BLOCKS = [
    ipaddress.IPv4Network(f"10.{a}.{b}.0/20") for a in range(224, 240) for b in range(0, 256, 16)
]
MAX_NODES = 15  # a /20 holds the bridge's /24 and 15 docker0s


def available() -> str:
    """ "" when this machine can make isolated nodes, else why not (and the fix)."""
    if os.geteuid() != 0:
        return "isolated nodes need root (network namespaces, a dockerd per node)"
    for tool in ("ip", "nsenter", "dockerd", "iptables"):
        if shutil.which(tool) is None:
            return f"isolated nodes need {tool!r} on PATH"
    if not (FREEZER / "cgroup.procs").exists():
        return f"isolated nodes need the cgroup v1 freezer at {FREEZER}"
    return ""


def run_cmd(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _routes() -> list[ipaddress.IPv4Network]:
    out = run_cmd("ip", "-4", "route", "show", "table", "all").stdout
    found: list[ipaddress.IPv4Network] = []
    for line in out.splitlines():
        first = line.split()[1] if line.split()[0] in ("local", "broadcast") else line.split()[0]
        with contextlib.suppress(ValueError):
            if first != "default":
                found.append(ipaddress.IPv4Network(first, strict=False))
    return found


def plan(cluster_dir: Path, names: list[str], images: list[str]) -> dict[str, Any]:
    """Names and addresses of an isolated cluster's network (nothing is made yet): a /20
    block that no route of this machine overlaps."""
    if len(names) > MAX_NODES:
        raise ClusterError(f"--isolated: at most {MAX_NODES} nodes, not {len(names)}")
    digest = hashlib.sha256(str(cluster_dir).encode()).hexdigest()
    tag = digest[:6]
    routes = _routes()
    start = int(digest[6:10], 16) % len(BLOCKS)
    for block in BLOCKS[start:] + BLOCKS[:start]:
        if not any(block.overlaps(r) for r in routes):
            break
    else:
        raise ClusterError("--isolated: every 10.224.0.0/12 block overlaps a route here")
    subnets = list(block.subnets(new_prefix=24))
    hosts = list(subnets[0].hosts())
    nodes = {
        name: {
            "ip": str(hosts[i + 1]),
            "netns": f"denv-{tag}-{name}",
            "veth": f"dnv{tag}{i:x}",
            "cgroup": f"denv-{tag}-{name}",
            "bip": f"{next(subnets[i + 1].hosts())}/24",
            "root": str(cluster_dir / "engines" / name),
            # its socket, pidfile and exec root: unix socket paths must stay short (containerd
            # makes its own under the exec root; 104 bytes at most)
            "run": f"/tmp/denv-e{tag}-{name}",
        }
        for i, name in enumerate(names)
    }
    return {
        "tag": tag,
        "bridge": f"dnb{tag}",
        "subnet": str(subnets[0]),
        "gateway": str(hosts[0]),
        "images": images,
        "nodes": nodes,
    }


# the host side
def forward_rule(iso: dict[str, Any]) -> list[str]:
    return ["FORWARD", "-i", iso["bridge"], "-o", iso["bridge"], "-j", "ACCEPT"]


def make_host_side(iso: dict[str, Any]) -> None:
    """The host bridge, its gateway address, and the FORWARD rule for its own traffic."""
    bridge = iso["bridge"]
    if not Path(f"/sys/class/net/{bridge}").exists():
        run_cmd("ip", "link", "add", bridge, "type", "bridge")
    prefix = ipaddress.ip_network(iso["subnet"]).prefixlen
    run_cmd("ip", "addr", "replace", f"{iso['gateway']}/{prefix}", "dev", bridge)
    run_cmd("ip", "link", "set", bridge, "up")
    rule = forward_rule(iso)
    if run_cmd("iptables", "-C", *rule, check=False).returncode != 0:
        run_cmd("iptables", "-I", rule[0], "1", *rule[1:])


def remove_host_side(iso: dict[str, Any]) -> list[str]:
    done = []
    rule = forward_rule(iso)
    while run_cmd("iptables", "-C", *rule, check=False).returncode == 0:
        run_cmd("iptables", "-D", *rule)
        done.append(f"removed the iptables rule {' '.join(rule)}")
    if Path(f"/sys/class/net/{iso['bridge']}").exists():
        run_cmd("ip", "link", "del", iso["bridge"])
        done.append(f"removed the bridge {iso['bridge']}")
    return done


# one node
def node_prefix(node: dict[str, Any]) -> list[str]:
    """Runs a command in the node's cgroup and network namespace (its mounts stay this
    machine's: the node's engine sees its agent's volume mounts)."""
    script = 'echo $$ > "$0/cgroup.procs" && ns="$1" && shift && exec nsenter --net="$ns" -- "$@"'
    return ["sh", "-c", script, str(FREEZER / node["cgroup"]), str(NETNS_DIR / node["netns"])]


def docker_host(node: dict[str, Any]) -> str:
    return f"unix://{node['run']}/docker.sock"


def make_netns(iso: dict[str, Any], name: str) -> None:
    """The node's network namespace, its veth onto the host bridge, its address and route."""
    node = iso["nodes"][name]
    ns, veth = node["netns"], node["veth"]
    if not (NETNS_DIR / ns).exists():
        run_cmd("ip", "netns", "add", ns)
    if not Path(f"/sys/class/net/{veth}").exists():
        run_cmd("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        run_cmd("ip", "link", "set", f"{veth}p", "netns", ns)
    run_cmd("ip", "link", "set", veth, "master", iso["bridge"], "up")
    inside = ["ip", "netns", "exec", ns]
    run_cmd(*inside, "ip", "link", "set", f"{veth}p", "name", "eth0", check=False)
    prefix = ipaddress.ip_network(iso["subnet"]).prefixlen
    run_cmd(*inside, "ip", "addr", "replace", f"{node['ip']}/{prefix}", "dev", "eth0")
    run_cmd(*inside, "ip", "link", "set", "eth0", "up")
    run_cmd(*inside, "ip", "link", "set", "lo", "up")
    run_cmd(*inside, "ip", "route", "replace", "default", "via", iso["gateway"])


def _cgroup_pids(path: Path) -> list[int]:
    pids: list[int] = []
    for procs in path.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def kill_node(iso: dict[str, Any], name: str, state_dir: Path) -> list[str]:
    """Take node ``name`` down as a machine dies: every process of its cgroup (Ray, dockerd,
    containerd, the containers) frozen and SIGKILLed at once, then the mounts its engine and
    agent made undone, its cgroups and its network namespace (with its veth) deleted. Its
    engine's data root and its state dir stay, as a dead machine's disk does. Idempotent."""
    node = iso["nodes"][name]
    done: list[str] = []
    cgroup = FREEZER / node["cgroup"]
    if cgroup.is_dir():
        state = cgroup / "freezer.state"
        with contextlib.suppress(OSError):
            state.write_text("FROZEN")  # nothing forks or restarts while it is killed
        pids = _cgroup_pids(cgroup)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            state.write_text("THAWED")
        deadline = time.monotonic() + KILL_WAIT_S
        while _cgroup_pids(cgroup) and time.monotonic() < deadline:
            _reap()
            time.sleep(0.1)
        _reap()
        if pids:
            done.append(
                f"node {name}: killed its {len(pids)} processes (Ray, its engine, its containers)"
            )
    unmounted = unmount_under([Path(node["root"]), Path(node["run"]), state_dir])
    if unmounted:
        done.append(f"node {name}: unmounted {unmounted} mounts of its engine and volumes")
    _remove_cgroups(node["cgroup"])
    if (NETNS_DIR / node["netns"]).exists():
        run_cmd("ip", "netns", "del", node["netns"], check=False)
        done.append(f"node {name}: removed its network namespace {node['netns']}")
    if Path(f"/sys/class/net/{node['veth']}").exists():  # gone with the namespace, normally
        run_cmd("ip", "link", "del", node["veth"], check=False)
    return done


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def unmount_under(roots: list[Path]) -> int:
    """Unmount every mount at or below ``roots``, deepest first (lazily when busy)."""
    prefixes = [str(r.resolve()) for r in roots]
    with open("/proc/self/mountinfo") as info:
        points = [line.split()[4] for line in info]
    mine = [p for p in points if any(p == r or p.startswith(r + "/") for r in prefixes)]
    for point in sorted(set(mine), key=lambda p: p.count("/"), reverse=True):
        if run_cmd("umount", point, check=False).returncode != 0:
            run_cmd("umount", "-l", point, check=False)
    return len(set(mine))


def _remove_cgroups(name: str) -> None:
    """The node's cgroup in every hierarchy (the engine's cgroup parent makes it in each),
    its children first."""
    for hierarchy in CGROUP_ROOT.iterdir():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def remove(iso: dict[str, Any], state_root: Path) -> list[str]:
    """Every node down (``kill_node``), its engine's directory deleted; then the host bridge
    and its rule. What was done, one line each. Idempotent."""
    done: list[str] = []
    for name in iso.get("nodes", {}):
        done += kill_node(iso, name, state_root / name)
        node = iso["nodes"][name]
        shutil.rmtree(node["run"], ignore_errors=True)
        root = Path(node["root"])
        if root.exists():
            shutil.rmtree(root, ignore_errors=True)
            done.append(f"node {name}: removed its engine's data {root}")
    done += remove_host_side(iso)
    return done


def leftovers(iso: dict[str, Any]) -> list[str]:
    """What of an isolated cluster still exists on this machine (for tests and ``down``)."""
    left = []
    if Path(f"/sys/class/net/{iso['bridge']}").exists():
        left.append(f"bridge {iso['bridge']}")
    if run_cmd("iptables", "-C", *forward_rule(iso), check=False).returncode == 0:
        left.append(f"iptables rule {' '.join(forward_rule(iso))}")
    for name, node in iso.get("nodes", {}).items():
        if (NETNS_DIR / node["netns"]).exists():
            left.append(f"network namespace {node['netns']}")
        if Path(f"/sys/class/net/{node['veth']}").exists():
            left.append(f"veth {node['veth']}")
        left += [
            f"cgroup {h.name}/{node['cgroup']}"
            for h in CGROUP_ROOT.iterdir()
            if (h / node["cgroup"]).is_dir()
        ]
        for key in ("root", "run"):
            if Path(node[key]).exists():
                left.append(f"node {name}'s engine dir {node[key]}")
    return left
