"""Probe 9: a live child in a network namespace of its own, and what it costs per fork(8).

Run as root from the repository root (no Docker; it makes and deletes its own namespaces):

    python3 bench/live_fork_probe/p9_child_netns.py [--rounds 10] [--n 8] [--ballast-mb 64]
    python3 bench/live_fork_probe/p9_child_netns.py --memory 200   # kernel memory only

The set-up stands in for a node and one env's container, each a network namespace:

- ``lfp9-node-PID`` is the host: it routes the children's subnet (10.199.1.0/24) to the
  container (10.199.0.2, on a veth pair from 10.199.0.1), listens on 9100 and 9101 for the
  children's egress, and refuses 9101 from the container's interface (a host-side egress
  rule keyed on the container, as denv's are keyed on the env's bridge). This process moves
  itself into it, so the machine's own network namespace is never touched.
- ``lfp9-ctr-PID`` is the container: a bridge ``br0`` (10.199.1.1/24) whose ports are
  ``isolated`` (no frames between two of them), and iptables that refuse new connections
  from ``br0`` to the container itself (a child to its parent), from the container's own
  processes into ``br0`` (the parent to a child) and routed from ``br0`` back to ``br0``
  (a child to a sibling through the gateway); children's egress leaves masqueraded as the
  container's address.
- The parent: a Python process in the container's netns (``--ballast-mb`` of touched memory,
  so a fork copies page tables), listening on 9000. On request it clones n children the way
  the launcher does (one clone(2) with CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID, plus
  CLONE_NEWNET for the netns cases), each waiting on a pipe.
- Network slots (the two ``move`` cases): veth pairs made ahead of time in the container's
  netns, one end on ``br0`` (isolated), the other (``cN``) waiting to be moved into a
  child's netns.

A round is one fork(n) of one case; the cases alternate round by round:

- ``plain``: today's shape. Children share the container's netns, each on port 8001+i.
- ``netns_move_ipbatch``: CLONE_NEWNET; the host moves n slots into the n children's netns
  with one ``ip -n CTR -batch -`` subprocess (``link set cN netns PID``).
- ``netns_move_netlink``: the same with n RTM_NEWLINK messages in one send on a netlink
  socket the host holds in the container's netns (no subprocess).
- ``netns_create_ipbatch``: no pool; one ``ip -batch`` makes n veth pairs at the fork, each
  with its child's end made directly in the child's netns, the bridge end isolated and up,
  and a permanent neighbour entry for the child's address.
- ``netns_create_netlink``: the same as 3n messages in one send on the held socket.
- ``netns_create_netlink_del``: the same, and at the delete the host removes the n pairs
  (n RTM_DELLINK in one send, timed) before the kill, rather than waiting for the kernel.

In every case the host writes each child's uid/gid maps (as the node does today) and then
lets the children go. A netns child brings up ``lo`` and its interface with a MAC derived
from its address, sets 10.199.1.(10+i)/24 and a default route via 10.199.1.1 with one
netlink send of its own (no subprocess), drops its capabilities and listens on :8000. The
host then connects to every child until all answer. A veth dies with its namespace and
takes its peer, so the slots a move round used are gone after it and the host makes n new
ones (timed apart: off the fork's path). The kworker CPU from the kill until the pairs are
gone estimates the kernel's teardown of the namespaces.

Round 0 of each case also checks what separates the children (and that the checks can
fail: the plain case is expected to reach its sibling). Writes ``p9_child_netns.json``
next to itself; ``--memory N`` writes ``p9_child_netns_memory.json`` instead.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TAG = f"lfp9-{os.getpid()}"
NODE_NS = f"lfp9-node-{os.getpid()}"
CTR_NS = f"lfp9-ctr-{os.getpid()}"
NODE_IP, CTR_IP, GW_IP = "10.199.0.1", "10.199.0.2", "10.199.1.1"
SUBNET = "10.199.1.0/24"
PARENT_PORT, EGRESS_OK, EGRESS_DENIED = 9000, 9100, 9101
LISTENER: socket.socket | None = None

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine, 56)

# --- netlink, just what the probe sends ---------------------------------------------------
RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR, RTM_NEWROUTE, NLMSG_ERROR = 16, 17, 20, 24, 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 1, 4, 0x100, 0x200, 0x400
RTM_NEWNEIGH, NDA_DST, NDA_LLADDR, NUD_PERMANENT = 28, 1, 2, 0x80
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MASTER, IFLA_LINKINFO, IFLA_NET_NS_PID = 1, 3, 10, 18, 19
IFLA_INFO_KIND, IFLA_INFO_DATA, IFLA_INFO_SLAVE_KIND, IFLA_INFO_SLAVE_DATA = 1, 2, 4, 5
VETH_INFO_PEER, IFLA_BRPORT_ISOLATED = 1, 33
IFA_ADDRESS, IFA_LOCAL, RTA_OIF, RTA_GATEWAY = 1, 2, 4, 5
IFF_UP = 1


def _rta(kind: int, data: bytes) -> bytes:
    size = 4 + len(data)
    return struct.pack("=HH", size, kind) + data + b"\0" * (-size % 4)


def _nlmsg(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    return (
        struct.pack("=IHHII", 16 + len(body), kind, flags | NLM_F_REQUEST | NLM_F_ACK, seq, 0)
        + body
    )


def _link(index: int, up: bool, *attrs: bytes) -> bytes:
    return struct.pack(
        "=BxHiII", socket.AF_UNSPEC, 0, index, IFF_UP if up else 0, IFF_UP if up else 0
    ) + b"".join(attrs)


def netlink_send(sock: socket.socket, msgs: list[tuple[int, int, bytes]]) -> None:
    """Send every message in one write and wait for every ack; raise on the first error."""
    data = b"".join(
        _nlmsg(kind, flags, seq, body) for seq, (kind, flags, body) in enumerate(msgs, 1)
    )
    sock.send(data)
    left = set(range(1, len(msgs) + 1))
    errors = []
    while left:
        buf = sock.recv(65536)
        off = 0
        while off + 16 <= len(buf):
            size, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", buf, off)
            if kind == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", buf, off + 16)
                left.discard(seq)
                if err:
                    errors.append(f"message {seq}: {os.strerror(-err)}")
            off += (size + 3) & ~3
    if errors:
        raise OSError("netlink: " + "; ".join(errors))


def configure_own_netns(slot: str, addr: str, gw: str) -> None:
    """In the child: lo up, the slot up with its MAC and address, a default route; one send."""
    index = socket.if_nametoindex(slot)
    ip, plen = addr.split("/")
    ifa = struct.pack("=BBBBI", socket.AF_INET, int(plen), 0, 0, index)
    rt = struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, 254, 3, 0, 1, 0)
    oif = struct.pack("=i", index)
    mac = mac_of(ip)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as nl:
        netlink_send(nl, [
            (RTM_NEWLINK, 0, _link(1, True)),
            (RTM_NEWLINK, 0, _link(index, True, _rta(IFLA_ADDRESS, mac))),
            (RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL,
             ifa + _rta(IFA_LOCAL, socket.inet_aton(ip)) + _rta(IFA_ADDRESS, socket.inet_aton(ip))),
            (RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL,
             rt + _rta(RTA_GATEWAY, socket.inet_aton(gw)) + _rta(RTA_OIF, oif)),
        ])  # fmt: skip


def move_slots_netlink(sock: socket.socket, moves: list[tuple[str, int]]) -> None:
    """On the host: each slot into its child's netns, n RTM_NEWLINK in one send."""
    netlink_send(sock, [
        (RTM_NEWLINK, 0, _link(0, False, _rta(IFLA_IFNAME, name.encode() + b"\0"),
                               _rta(IFLA_NET_NS_PID, struct.pack("=I", pid))))
        for name, pid in moves
    ])  # fmt: skip


def delete_links_netlink(sock: socket.socket, names: list[str]) -> None:
    """On the host, at a delete: each child's pair, by its bridge end, n RTM_DELLINK in one
    send (the child's end goes with it), so its port and address go at once."""
    netlink_send(
        sock,
        [(RTM_DELLINK, 0, _link(0, False, _rta(IFLA_IFNAME, n.encode() + b"\0"))) for n in names],
    )


def mac_of(ip: str) -> bytes:
    """A child's MAC follows from its address (as Docker does): the container's neighbour
    entry for a reused address, left by an earlier child, stays right."""
    return b"\x02\x42" + socket.inet_aton(ip)


def create_slots_netlink(
    sock: socket.socket, pairs: list[tuple[str, int]], ips: list[str], br0: int
) -> None:
    """On the host, at the fork: per child a veth pair made with one end (``pNAME``) on
    br0 in the container's netns and the other (``NAME``) in the child's netns; then the
    bridge end isolated and up, and a permanent neighbour entry for the child's address
    (no ARP on the way in). 3n messages in one send."""
    msgs = []
    for (name, pid), ip in zip(pairs, ips, strict=True):
        peer = _link(0, False, _rta(IFLA_IFNAME, name.encode() + b"\0"),
                     _rta(IFLA_NET_NS_PID, struct.pack("=I", pid)))  # fmt: skip
        info = _rta(IFLA_INFO_KIND, b"veth\0") + _rta(IFLA_INFO_DATA, _rta(VETH_INFO_PEER, peer))
        host_end = f"p{name}".encode() + b"\0"
        msgs.append((RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, _link(
            0, False, _rta(IFLA_IFNAME, host_end), _rta(IFLA_MASTER, struct.pack("=I", br0)),
            _rta(IFLA_LINKINFO, info))))  # fmt: skip
        slave = _rta(IFLA_INFO_SLAVE_KIND, b"bridge\0") + _rta(
            IFLA_INFO_SLAVE_DATA, _rta(IFLA_BRPORT_ISOLATED, b"\1")
        )
        msgs.append((RTM_NEWLINK, 0, _link(0, True, _rta(IFLA_IFNAME, host_end),
                                           _rta(IFLA_LINKINFO, slave))))  # fmt: skip
        nd = struct.pack("=BxxxiHBB", socket.AF_INET, br0, NUD_PERMANENT, 0, 0)
        nd += _rta(NDA_DST, socket.inet_aton(ip)) + _rta(NDA_LLADDR, mac_of(ip))
        msgs.append((RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, nd))
    netlink_send(sock, msgs)


def setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def drop_caps() -> None:
    """Every capability of this user namespace, for good (bounding set, then capset)."""
    for cap in range(64):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP; EINVAL past the last cap
            break
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


# --- the parent, inside the container's netns ---------------------------------------------


def clone(flags: int) -> int:
    api = ctypes.pythonapi
    libc.syscall.restype = ctypes.c_long
    api.PyOS_BeforeFork()
    pid = libc.syscall(
        ctypes.c_long(SYS_CLONE), ctypes.c_ulong(flags | signal.SIGCHLD), None, None, None, None
    )
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, os.strerror(err))
    return int(pid)


def child_main(spec: dict[str, Any], go_r: int, report_w: int) -> None:
    """Wait for the host's go, take the network, serve; never returns."""
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.read(go_r, 1)
        t0, c0 = time.perf_counter(), time.process_time()
        if spec["net"]:
            configure_own_netns(spec["slot"], spec["addr"], GW_IP)
        t1, c1 = time.perf_counter(), time.process_time()
        drop_caps()
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", spec["port"]))
        srv.listen(64)
        t2 = time.perf_counter()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        os.write(report_w, (json.dumps({
            "i": spec["i"], "pid_in_ns": os.getpid(),
            "net_ms": (t1 - t0) * 1e3, "net_cpu_ms": (c1 - c0) * 1e3,
            "go_to_listening_ms": (t2 - t0) * 1e3,
            "cpu_since_clone_ms": (ru.ru_utime + ru.ru_stime) * 1e3,
        }) + "\n").encode())  # fmt: skip
        os.close(report_w)
        while True:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(5)
                words = conn.recv(256).decode().split()
                if words and words[0] == "connect":
                    out = try_connect(words[1], int(words[2]))
                else:
                    out = f"child {spec['i']}"
                conn.sendall(out.encode())
    except BaseException as exc:  # a child reports and ends, whatever it was
        with contextlib.suppress(OSError):
            os.write(report_w, (json.dumps({"i": spec["i"], "error": repr(exc)}) + "\n").encode())
    finally:
        os._exit(1)


def try_connect(ip: str, port: int, timeout: float = 0.5) -> str:
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"hello\n")
            return "connected: " + s.recv(256).decode(errors="replace")
    except OSError as exc:
        return f"refused: {type(exc).__name__}: {exc}"


def parent_main(ballast_mb: int) -> None:
    ballast = bytearray(ballast_mb << 20)
    for off in range(0, len(ballast), 4096):
        ballast[off] = 1
    global LISTENER
    listener = LISTENER = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", PARENT_PORT))
    listener.listen(16)

    def answer() -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(b"parent")

    threading.Thread(target=answer, daemon=True).start()
    kids: list[int] = []
    gos: list[int] = []
    report_r = -1
    out = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "fork":
            report_r, report_w = os.pipe()
            flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | (CLONE_NEWNET if req["net"] else 0)
            clone_ms, clone_cpu_ms = [], []
            t_all = time.perf_counter()
            for spec in req["children"]:
                go_r, go_w = os.pipe()
                t0, c0 = time.perf_counter(), time.process_time()
                pid = clone(flags)
                if pid == 0:
                    os.close(go_w)
                    os.close(report_r)
                    listener.close()  # the parent's port is not the child's to serve
                    child_main(spec, go_r, report_w)
                clone_ms.append((time.perf_counter() - t0) * 1e3)
                clone_cpu_ms.append((time.process_time() - c0) * 1e3)
                os.close(go_r)
                kids.append(pid)
                gos.append(go_w)
            os.close(report_w)
            reply: dict[str, Any] = {
                "pids": kids, "clone_ms": clone_ms, "clone_cpu_ms": clone_cpu_ms,
                "fork_ms": (time.perf_counter() - t_all) * 1e3,
            }  # fmt: skip
        elif op == "go":
            for fd in gos:
                os.write(fd, b"g")
                os.close(fd)
            gos = []
            reports: list[dict[str, Any]] = []
            buf = b""
            deadline = time.monotonic() + 10
            while len(reports) < len(kids) and time.monotonic() < deadline:
                if select.select([report_r], [], [], 0.5)[0]:
                    chunk = os.read(report_r, 65536)
                    if not chunk:
                        break
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    reports += [json.loads(x) for x in lines if x]
            reply = {"reports": reports}
        elif op == "connect":
            reply = {"result": try_connect(req["ip"], req["port"])}
        elif op == "kill":
            for pid in kids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for pid in kids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            for fd in gos:
                os.close(fd)
            if report_r >= 0:
                os.close(report_r)
                report_r = -1
            kids, gos = [], []
            reply = {"ok": True}
        else:
            break
        out.write(json.dumps(reply) + "\n")
        out.flush()


# --- the host (node) side -----------------------------------------------------------------


def run(*args: str, check: bool = True, stdin: str | None = None) -> str:
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def kworker_ms() -> float:
    """CPU of every kworker thread so far (schedstat, ns): the kernel dismantles a dead
    network namespace in a workqueue, outside any process of ours. Other work on the
    machine lands here too: compare with the plain case's window."""
    total = 0
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if comm.read_text().startswith("kworker"):
                total += int((comm.parent / "schedstat").read_text().split()[0])
    return total / 1e6


def children_cpu_ms() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (ru.ru_utime + ru.ru_stime) * 1e3


class Probe:
    def __init__(self, n: int, ballast_mb: int) -> None:
        self.n = n
        self.ballast_mb = ballast_mb
        self.parent: subprocess.Popen[str] | None = None
        self.kid_pids: list[int] = []
        self.slot_seq = 0
        self.slots: list[str] = []
        self.nl: socket.socket | None = None
        self.br0 = 0
        self.peers: dict[int, list[str]] = {EGRESS_OK: [], EGRESS_DENIED: []}
        self.listeners: list[socket.socket] = []
        self.host_ns_fd = -1

    # set-up and tear-down
    def setup(self) -> None:
        self.host_ns_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        run("ip", "netns", "add", NODE_NS)
        run("ip", "netns", "add", CTR_NS)
        batch_node = f"""link add p9n type veth peer name eth0 netns {CTR_NS}
addr add {NODE_IP}/30 dev p9n
link set p9n up
link set lo up
route add {SUBNET} via {CTR_IP}
"""
        run("ip", "-n", NODE_NS, "-batch", "-", stdin=batch_node)
        batch_ctr = f"""addr add {CTR_IP}/30 dev eth0
link set eth0 up
link set lo up
route add default via {NODE_IP}
link add br0 type bridge
addr add {GW_IP}/24 dev br0
link set br0 up
"""
        run("ip", "-n", CTR_NS, "-batch", "-", stdin=batch_ctr)
        run("ip", "netns", "exec", CTR_NS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        run("ip", "netns", "exec", CTR_NS, "iptables-restore", stdin=f"""*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i br0 -m conntrack --ctstate NEW -j REJECT --reject-with icmp-admin-prohibited
-A FORWARD -i br0 -o br0 -j DROP
-A FORWARD -i br0 -o eth0 -j ACCEPT
-A OUTPUT -o br0 -m conntrack --ctstate NEW -j REJECT --reject-with icmp-admin-prohibited
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -s {SUBNET} -o eth0 -j MASQUERADE
COMMIT
""")  # fmt: skip
        refuse = "-j REJECT --reject-with tcp-reset"
        run("ip", "netns", "exec", NODE_NS, "iptables-restore", stdin=f"""*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i p9n -p tcp --dport {EGRESS_DENIED} -m conntrack --ctstate NEW {refuse}
COMMIT
""")  # fmt: skip
        # The host's netlink socket into the container's netns, made there, then back home.
        setns(f"/run/netns/{CTR_NS}")
        self.nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.br0 = socket.if_nametoindex("br0")
        setns(f"/run/netns/{NODE_NS}")  # from here on this process is "the host"
        for port in (EGRESS_OK, EGRESS_DENIED):
            lst = socket.socket()
            lst.bind((NODE_IP, port))
            lst.listen(16)
            self.listeners.append(lst)
            threading.Thread(target=self._egress_listener, args=(lst, port), daemon=True).start()
        self.refill()
        self.parent = subprocess.Popen(
            ["ip", "netns", "exec", CTR_NS, sys.executable, __file__, "--parent",
             "--ballast-mb", str(self.ballast_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while try_connect(CTR_IP, PARENT_PORT, 0.2) != "connected: parent":
            if time.monotonic() > deadline or self.parent.poll() is not None:
                raise RuntimeError("the parent did not start")
            time.sleep(0.1)

    def _egress_listener(self, lst: socket.socket, port: int) -> None:
        while True:
            try:
                conn, peer = lst.accept()
            except OSError:
                return
            with conn:
                self.peers[port].append(peer[0])
                conn.sendall(f"node:{port}".encode())

    def cleanup(self) -> list[str]:
        problems = []
        for pid in self.kid_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.parent is not None:
            with contextlib.suppress(Exception):
                self.parent.kill()
                self.parent.wait(5)
        for lst in self.listeners:
            lst.close()
        if self.nl is not None:
            self.nl.close()
        if self.host_ns_fd >= 0:
            libc.setns(self.host_ns_fd, CLONE_NEWNET)
            os.close(self.host_ns_fd)
        for ns in (CTR_NS, NODE_NS):
            proc = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if proc.returncode != 0 and "No such file" not in proc.stderr:
                problems.append(f"ip netns del {ns}: {proc.stderr.strip()}")
        left = [ns for ns in run("ip", "netns", "list").split() if ns.startswith("lfp9-")]
        if left:
            problems.append(f"namespaces left: {left}")
        return problems

    def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.parent is not None and self.parent.stdin and self.parent.stdout
        self.parent.stdin.write(json.dumps(req) + "\n")
        self.parent.stdin.flush()
        line = self.parent.stdout.readline()
        if not line:
            raise RuntimeError("the parent ended")
        return dict(json.loads(line))

    def refill(self) -> dict[str, float]:
        """n new slots: veth pairs in the container's netns, one end an isolated br0 port."""
        lines, names = [], []
        for _ in range(self.n):
            k = self.slot_seq
            self.slot_seq += 1
            lines += [
                f"link add c{k} type veth peer name s{k}",
                f"link set s{k} master br0",
                f"link set dev s{k} type bridge_slave isolated on",
                f"link set s{k} up",
            ]
            names.append(f"c{k}")
        t0, c0 = time.perf_counter(), children_cpu_ms()
        run("ip", "-n", CTR_NS, "-batch", "-", stdin="\n".join(lines) + "\n")
        self.slots = names
        return {
            "refill_ms": (time.perf_counter() - t0) * 1e3,
            "refill_cpu_ms": children_cpu_ms() - c0,
        }

    # one round
    def round(self, case: str, checks: bool) -> dict[str, Any]:
        net = case != "plain"
        children: list[dict[str, Any]] = []
        creating = case.startswith("netns_create")
        if creating:  # no pool: the pairs are made at the fork, named now
            slots = [f"e{self.slot_seq + i}" for i in range(self.n)]
            self.slot_seq += self.n
        else:
            slots = self.slots
        for i in range(self.n):
            if net:
                children.append(
                    {
                        "i": i,
                        "net": True,
                        "slot": slots[i],
                        "addr": f"10.199.1.{10 + i}/24",
                        "port": 8000,
                    }
                )
            else:
                children.append({"i": i, "net": False, "port": 8001 + i})
        targets: list[tuple[str, int]] = [
            (str(c["addr"]).split("/")[0], 8000) if net else (CTR_IP, int(c["port"]))
            for c in children
        ]
        row: dict[str, Any] = {"case": case}
        t0 = time.perf_counter()
        forked = self.ask({"op": "fork", "net": net, "children": children})
        t_forked = time.perf_counter()
        self.kid_pids = forked["pids"]
        row.update(fork_reply_ms=(t_forked - t0) * 1e3, parent_fork_ms=forked["fork_ms"],
                   clone_ms=statistics.median(forked["clone_ms"]),
                   clone_cpu_ms=statistics.median(forked["clone_cpu_ms"]))  # fmt: skip
        # The node's step: uid/gid maps (today's), then the network (new).
        tm = time.perf_counter()
        for pid in self.kid_pids:
            Path(f"/proc/{pid}/uid_map").write_text("0 0 1\n")
            Path(f"/proc/{pid}/gid_map").write_text("0 0 1\n")
        row["host_maps_ms"] = (time.perf_counter() - tm) * 1e3
        tn, cpu_self, cpu_kids = time.perf_counter(), time.process_time(), children_cpu_ms()
        moves = list(zip(slots, self.kid_pids, strict=True))
        if case.startswith("netns_create_netlink"):
            assert self.nl is not None
            create_slots_netlink(self.nl, moves, [ip for ip, _ in targets], self.br0)
        elif case == "netns_create_ipbatch":
            run("ip", "-n", CTR_NS, "-batch", "-", stdin="".join(
                f"link add p{s} type veth peer name {s} netns {p}\n"
                f"link set p{s} master br0\n"
                f"link set dev p{s} type bridge_slave isolated on\n"
                f"link set p{s} up\n"
                f"neigh replace {ip} lladdr {mac_of(ip).hex(':')} dev br0 nud permanent\n"
                for (s, p), (ip, _) in zip(moves, targets, strict=True)))  # fmt: skip
        elif case == "netns_move_ipbatch":
            run(
                "ip",
                "-n",
                CTR_NS,
                "-batch",
                "-",
                stdin="".join(f"link set {s} netns {p}\n" for s, p in moves),
            )
        elif case == "netns_move_netlink":
            assert self.nl is not None
            move_slots_netlink(self.nl, moves)
        row["host_net_ms"] = (time.perf_counter() - tn) * 1e3
        row["host_net_cpu_ms"] = (
            (time.process_time() - cpu_self) * 1e3 + children_cpu_ms() - cpu_kids
        )
        went = self.ask({"op": "go"})
        t_reports = time.perf_counter()
        reports = went["reports"]
        errors = [r for r in reports if "error" in r]
        if len(reports) != self.n or errors:
            raise RuntimeError(f"children did not come up: {errors or reports}")
        row["child_net_ms"] = statistics.median(r["net_ms"] for r in reports)
        row["child_net_cpu_ms"] = statistics.median(r["net_cpu_ms"] for r in reports)
        row["child_go_to_listening_ms"] = statistics.median(
            r["go_to_listening_ms"] for r in reports
        )
        row["child_cpu_since_clone_ms"] = statistics.median(
            r["cpu_since_clone_ms"] for r in reports
        )
        row["children_reported_ms"] = (t_reports - t0) * 1e3
        # Ingress: the host reaches every child at its own address.
        answers, retries = [], []
        deadline = time.monotonic() + 5
        for ip, port in targets:
            while True:
                got = try_connect(ip, port, 0.5)
                if got.startswith("connected") or time.monotonic() > deadline:
                    answers.append(got)
                    break
                retries.append(f"{ip}:{port} {got}")
                time.sleep(0.002)
        row["connect_retries"] = retries
        row["all_answer_ms"] = (time.perf_counter() - t0) * 1e3
        want = [f"connected: child {i}" for i in range(self.n)]
        if answers != want:
            raise RuntimeError(
                f"{case}: the host did not reach every child at its address: {answers}"
            )
        if checks:
            row["checks"] = self.checks(net, targets)
            if net:  # the sibling check is refused because the bridge ports are isolated
                dev = f"p{slots[1]}" if creating else f"s{slots[1][1:]}"
                shown = run("ip", "-n", CTR_NS, "-d", "-o", "link", "show", "dev", dev)
                row["checks"]["sibling_port_isolated"] = "isolated on" in shown
        kw0, tk = kworker_ms(), time.perf_counter()
        if case == "netns_create_netlink_del":  # the node deletes the pairs, then the kill
            assert self.nl is not None
            td, cd = time.perf_counter(), time.process_time()
            delete_links_netlink(self.nl, [f"p{name}" for name in slots])
            row["host_del_ms"] = (time.perf_counter() - td) * 1e3
            row["host_del_cpu_ms"] = (time.process_time() - cd) * 1e3
        self.ask({"op": "kill"})
        self.kid_pids = []
        if not net:
            time.sleep(0.06)  # about the netns cases' wait, for the kworker comparison
        if net:
            # The used slots went with the children's namespaces (veth takes its peer).
            t_gone = time.perf_counter()
            while True:
                names = {
                    w.split("@")[0].rstrip(":")
                    for w in run("ip", "-n", CTR_NS, "-o", "link", "show").split()
                }
                still = [n for n in slots if (f"p{n}" if creating else f"s{n[1:]}") in names]
                if not still or time.perf_counter() - t_gone > 5:
                    break
                time.sleep(0.05)
            row["slots_gone_after_ms"] = (time.perf_counter() - t_gone) * 1e3
            row["slots_left"] = len(still)
        row["teardown_window_ms"] = (time.perf_counter() - tk) * 1e3
        row["teardown_kworker_cpu_ms"] = kworker_ms() - kw0
        if net and not creating:
            row.update(self.refill())
        return row

    def child_says(self, target: tuple[str, int], ip: str, port: int) -> str:
        with socket.create_connection(target, timeout=3) as s:
            s.settimeout(3)
            s.sendall(f"connect {ip} {port}\n".encode())
            return s.recv(512).decode()

    def checks(self, net: bool, targets: list[tuple[str, int]]) -> dict[str, Any]:
        c0, c1 = targets[0], targets[1]
        before = {port: len(peers) for port, peers in self.peers.items()}
        out: dict[str, Any] = {
            "child0_to_sibling1": self.child_says(c0, *c1),
            "child0_to_parent_port": self.child_says(c0, CTR_IP, PARENT_PORT),
            "child0_to_parent_via_gateway": self.child_says(c0, GW_IP, PARENT_PORT),
            "parent_to_child1": self.ask({"op": "connect", "ip": c1[0], "port": c1[1]})["result"],
            "child0_egress_allowed": self.child_says(c0, NODE_IP, EGRESS_OK),
            "child0_egress_denied_by_host_rule": self.child_says(c0, NODE_IP, EGRESS_DENIED),
            "parent_egress_denied_by_host_rule": self.ask(
                {"op": "connect", "ip": NODE_IP, "port": EGRESS_DENIED})["result"],
        }  # fmt: skip
        time.sleep(0.05)
        out["host_saw_child_egress_from"] = self.peers[EGRESS_OK][before[EGRESS_OK] :]
        if net:
            expect_refused = [
                "child0_to_sibling1",
                "child0_to_parent_port",
                "child0_to_parent_via_gateway",
                "parent_to_child1",
                "child0_egress_denied_by_host_rule",
                "parent_egress_denied_by_host_rule",
            ]
            ok = all(out[k].startswith("refused") for k in expect_refused)
            ok = ok and out["child0_egress_allowed"].startswith("connected")
            ok = ok and out["host_saw_child_egress_from"] == [CTR_IP]
        else:  # today's shape: the check must be able to fail
            ok = out["child0_to_sibling1"].startswith("connected")
        out["as_expected"] = ok
        return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [
        k for k, v in rows[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    return {k: round(statistics.median(r[k] for r in rows if k in r), 3) for k in keys}


def meminfo_kib() -> dict[str, int]:
    keys = ("SUnreclaim", "Percpu", "Slab", "MemAvailable")
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in keys:
            out[name] = int(rest.split()[0])
    return out


def kernel_memory(count: int) -> dict[str, Any]:
    """The kernel memory of ``count`` children's networks: a named netns each (standing in
    for a child's) with its end of a veth pair, the other end on an isolated bridge port.
    Read from /proc/meminfo, so the rest of the machine moves it too: run it twice."""
    bridge_ns = f"lfp9-mem-{os.getpid()}"
    names = [f"lfp9-m{os.getpid()}-{i}" for i in range(count)]
    made: list[str] = []
    out: dict[str, Any] = {"count": count}
    try:
        run("ip", "netns", "add", bridge_ns)
        made.append(bridge_ns)
        run(
            "ip",
            "-n",
            bridge_ns,
            "-batch",
            "-",
            stdin="link add br0 type bridge\nlink set br0 up\n",
        )
        time.sleep(1)
        before = meminfo_kib()
        t0, c0 = time.perf_counter(), children_cpu_ms()
        run("ip", "-batch", "-", stdin="".join(f"netns add {n}\n" for n in names))
        made += names
        run("ip", "-n", bridge_ns, "-batch", "-", stdin="".join(
            f"link add p{i} type veth peer name eth0 netns {n}\n"
            f"link set p{i} master br0\n"
            f"link set dev p{i} type bridge_slave isolated on\n"
            f"link set p{i} up\n" for i, n in enumerate(names)))  # fmt: skip
        home = f"/proc/self/task/{threading.get_native_id()}/ns/net"
        home_fd = os.open(home, os.O_RDONLY)
        try:
            for n in names:  # up in each, as a child would do it: one netlink send
                setns(f"/run/netns/{n}")
                with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as nl:
                    eth0 = socket.if_nametoindex("eth0")
                    netlink_send(nl, [(RTM_NEWLINK, 0, _link(1, True)),
                                      (RTM_NEWLINK, 0, _link(eth0, True))])  # fmt: skip
        finally:
            libc.setns(home_fd, CLONE_NEWNET)
            os.close(home_fd)
        out["make_ms"] = (time.perf_counter() - t0) * 1e3
        out["make_cpu_ms"] = children_cpu_ms() - c0
        time.sleep(1)
        after = meminfo_kib()
        out["per_child_kib"] = {k: round((after[k] - before[k]) / count, 1) for k in before}
    finally:
        for n in reversed(made):
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
    time.sleep(3)
    gone = meminfo_kib()
    out["per_child_kib_after_delete"] = {k: round((gone[k] - before[k]) / count, 1) for k in before}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--ballast-mb", type=int, default=64)
    ap.add_argument("--parent", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--memory", type=int, default=0, metavar="N", help="only: kernel memory of N children"
    )
    args = ap.parse_args()
    if args.memory:
        mem: dict[str, Any] = {"loadavg_before": os.getloadavg()}
        mem["runs"] = [kernel_memory(args.memory) for _ in range(2)]
        mem["loadavg_after"] = os.getloadavg()
        (HERE / "p9_child_netns_memory.json").write_text(json.dumps(mem, indent=2) + "\n")
        print(json.dumps(mem, indent=2))
        return 0
    if args.parent:
        parent_main(args.ballast_mb)
        return 0
    if os.geteuid() != 0:
        sys.exit("run as root: the probe makes network namespaces and writes uid maps")
    cases = [
        "plain",
        "netns_move_ipbatch",
        "netns_move_netlink",
        "netns_create_ipbatch",
        "netns_create_netlink",
        "netns_create_netlink_del",
    ]
    probe = Probe(args.n, args.ballast_mb)
    result: dict[str, Any] = {
        "n": args.n, "rounds": args.rounds, "ballast_mb": args.ballast_mb,
        "kernel": os.uname().release, "python": sys.version.split()[0],
        "loadavg_before": os.getloadavg(),
    }  # fmt: skip
    rows: list[dict[str, Any]] = []
    try:
        probe.setup()
        for r in range(args.rounds):
            order = cases if r % 2 == 0 else cases[::-1]
            for case in order:
                row = probe.round(case, checks=(r == 0))
                row["round"] = r
                rows.append(row)
                print(
                    json.dumps(
                        {
                            k: (round(v, 2) if isinstance(v, float) else v)
                            for k, v in row.items()
                            if k != "checks"
                        }
                    )
                )
    finally:
        problems = probe.cleanup()
        result["cleanup_problems"] = problems
        if problems:
            print("cleanup:", problems, file=sys.stderr)
    result["loadavg_after"] = os.getloadavg()
    result["median"] = {c: summarize([r for r in rows if r["case"] == c]) for c in cases}
    result["checks"] = {r["case"]: r["checks"] for r in rows if "checks" in r}
    result["rows"] = rows
    (HERE / "p9_child_netns.json").write_text(json.dumps(result, indent=2) + "\n")
    loads = [result["loadavg_before"], result["loadavg_after"]]
    summary = {"median": result["median"], "checks": result["checks"], "loadavg": loads}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
