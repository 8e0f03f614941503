"""The netlink requests a live child's network takes, in its container's network namespace.

Just what is sent (linux/rtnetlink.h, if_link.h, neighbour.h), on a socket opened in the
container's namespace by a thread that enters it and ends (:func:`open_in`): a child's veth
pair, made straight into its own namespace, in one request (:func:`add_pair`), and the
addresses of a namespace (:func:`dump_addrs`), where its bridge is found after a restart.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading

RTM_NEWLINK, RTM_GETADDR, RTM_NEWNEIGH, NLMSG_ERROR, NLMSG_DONE = 16, 22, 28, 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 1, 4, 0x300
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MASTER, IFLA_LINKINFO, IFLA_NET_NS_PID = 1, 3, 10, 18, 19
IFLA_INFO_KIND, IFLA_INFO_DATA, IFLA_INFO_SLAVE_KIND, IFLA_INFO_SLAVE_DATA = 1, 2, 4, 5
VETH_INFO_PEER, IFLA_BRPORT_ISOLATED = 1, 33
NDA_DST, NDA_LLADDR, NUD_PERMANENT = 1, 2, 0x80
IFA_LOCAL, IFA_LABEL = 2, 3
IFF_UP = 1
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetError(OSError):
    """A live child's network could not be made (the fork of that child fails)."""


def _rta(kind: int, data: bytes) -> bytes:
    size = 4 + len(data)
    return struct.pack("=HH", size, kind) + data + b"\0" * (-size % 4)


def _link(index: int, up: bool, *attrs: bytes) -> bytes:
    flags = IFF_UP if up else 0
    return struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, flags, flags) + b"".join(attrs)


def _name(name: str) -> bytes:
    return _rta(IFLA_IFNAME, name.encode() + b"\0")


def send(sock: socket.socket, msgs: list[tuple[int, int, bytes]]) -> list[int]:
    """Send every message in one write and wait for every ack: each one's errno (0: done)."""
    data = b"".join(
        struct.pack("=IHHII", 16 + len(body), kind, flags | NLM_F_REQUEST | NLM_F_ACK, seq, 0)
        + body
        for seq, (kind, flags, body) in enumerate(msgs, 1)
    )
    sock.send(data)
    errors = [0] * len(msgs)
    left = set(range(1, len(msgs) + 1))
    while left:
        buf = sock.recv(65536)
        off = 0
        while off + 16 <= len(buf):
            size, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", buf, off)
            if kind == NLMSG_ERROR and seq in left:
                (err,) = struct.unpack_from("=i", buf, off + 16)
                left.discard(seq)
                errors[seq - 1] = -err
            off += (size + 3) & ~3
    return errors


def mac_of(ip: str) -> bytes:
    """A child's MAC follows from its address (as Docker's do): a neighbour entry left for
    an address's earlier child can never point a new one's frames elsewhere."""
    return b"\x02\x42" + socket.inet_aton(ip)


def open_in(pid: int) -> socket.socket:
    """A netlink socket in the network namespace of ``pid`` (a socket stays in the
    namespace it was made in). Made on a thread of its own, which then ends: the server's
    threads never leave the host's namespace."""
    out: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            finally:
                os.close(fd)
            out.append(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
        except BaseException as exc:  # handed to the caller
            out.append(exc)

    t = threading.Thread(target=make, name="denv-live-netns")
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        raise NetError(f"entering the env's network namespace failed: {out[0]}")
    return out[0]


def add_pair(
    nl: socket.socket, bridge: int, host_end: str, child_if: str, ip: str, pid: int
) -> int:
    """A veth pair from the socket's namespace into that of ``pid``: ``host_end`` a port
    of ``bridge`` (its index), isolated and up, with a permanent neighbour entry for ``ip``;
    ``child_if`` made directly in the child's namespace, its MAC following ``ip``. 0, or
    the errno of the step that failed (EEXIST: ``host_end`` is still there)."""
    peer = _link(
        0,
        False,
        _name(child_if),
        _rta(IFLA_ADDRESS, mac_of(ip)),
        _rta(IFLA_NET_NS_PID, struct.pack("=I", pid)),
    )
    info = _rta(IFLA_INFO_KIND, b"veth\0") + _rta(IFLA_INFO_DATA, _rta(VETH_INFO_PEER, peer))
    made = send(nl, [(
        RTM_NEWLINK,
        NLM_F_CREATE | NLM_F_EXCL,
        _link(0, False, _name(host_end), _rta(IFLA_MASTER, struct.pack("=I", bridge)),
              _rta(IFLA_LINKINFO, info)),
    )])[0]  # fmt: skip
    if made:
        return made
    slave = _rta(IFLA_INFO_SLAVE_KIND, b"bridge\0") + _rta(
        IFLA_INFO_SLAVE_DATA, _rta(IFLA_BRPORT_ISOLATED, b"\1")
    )
    nd = struct.pack("=BxxxiHBB", socket.AF_INET, bridge, NUD_PERMANENT, 0, 0)
    nd += _rta(NDA_DST, socket.inet_aton(ip)) + _rta(NDA_LLADDR, mac_of(ip))
    errs = send(nl, [
        (RTM_NEWLINK, 0, _link(0, True, _name(host_end), _rta(IFLA_LINKINFO, slave))),
        (RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, nd),
    ])  # fmt: skip
    return next((e for e in errs if e), 0)


def dump_addrs(nl: socket.socket) -> list[tuple[str, str, int, int]]:
    """Every IPv4 address of the socket's namespace: (label, address, prefix, link index)."""
    body = struct.pack("=BBBBI", socket.AF_INET, 0, 0, 0, 0)
    nl.send(struct.pack("=IHHII", 16 + len(body), RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
            + body)  # fmt: skip
    found: list[tuple[str, str, int, int]] = []
    while True:
        buf = nl.recv(65536)
        off = 0
        while off + 16 <= len(buf):
            size, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", buf, off)
            if kind in (NLMSG_DONE, NLMSG_ERROR):
                return found
            _fam, plen, _fl, _scope, index = struct.unpack_from("=BBBBI", buf, off + 16)
            attrs = off + 24
            label, local = "", ""
            while attrs + 4 <= off + size:
                alen, akind = struct.unpack_from("=HH", buf, attrs)
                value = buf[attrs + 4 : attrs + alen]
                if akind == IFA_LOCAL:
                    local = socket.inet_ntoa(value[:4])
                elif akind == IFA_LABEL:
                    label = value.rstrip(b"\0").decode()
                attrs += (alen + 3) & ~3
            found.append((label, local, plen, index))
            off += (size + 3) & ~3
