"""The node relay: the one door from the control plane's ingress to the envs of this node.

A node's env networks are routable only on the node. The relay listens on the node's address;
a connection that proves it holds the cluster's relay key (the handshake of
``denv.server.ingress.relay``) names an env address of this node, the relay connects to it and
then copies bytes both ways (HTTP and WebSocket alike: it parses neither). A connection
without the key gets a refusal and is closed: nothing reaches an env, and the relay never
connects anywhere for it. An authenticated client may only name addresses of the node's env
subnets (``allowed``), never their gateways (the node itself), and of its live children's
(``with_live_children``).

    relay = Relay(key, env_addresses("172.30.0.0/16", 28))
    host, port = relay.start("10.0.0.5", 0)     # its own event loop, in a daemon thread
    ...
    relay.close()

Copying is done with asyncio protocols: one ``write`` per ``data_received``, back-pressure by
pausing the other side's reads while a side's write buffer is full.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from denv.server.docker.live import host_routes
from denv.server.ingress import relay as wire

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0


def env_addresses(pool: str, prefix: int) -> Callable[[str], bool]:
    """Whether an address is an env's on this node: in the subnet pool its env networks are
    cut from (subnets of ``/prefix``), and not a subnet's network, gateway or broadcast
    address (the gateway is the node's own side of the bridge)."""
    net = ipaddress.ip_network(pool)

    def allowed(ip: str) -> bool:
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        if addr.version != net.version or addr not in net:
            return False
        subnet = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
        offset = int(addr) - int(subnet.network_address)
        return offset not in (0, 1, subnet.num_addresses - 1)

    return allowed


def with_live_children(
    envs: Callable[[str], bool], route_table: str = "/proc/net/route"
) -> Callable[[str], bool]:
    """``envs``, and the addresses of live children on this node (``denv serve
    --live-netns``: each in a network namespace of its own, on a subnet this host routes
    through its container's address, which ``envs`` must allow; ``host_routes.routed_via``)."""

    def allowed(ip: str) -> bool:
        if envs(ip):
            return True
        via = host_routes.routed_via(ip, route_table)
        return via is not None and envs(via)

    return allowed


class _Side(asyncio.Protocol):
    """One end of a relayed connection: what it receives is written to its peer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []  # received before the peer was connected
        self.ended = False  # its end sent EOF

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def join(self, peer: _Side) -> None:
        self.peer = peer
        for data in self.pending:
            self._forward(data)
        self.pending = []

    def _forward(self, data: bytes) -> None:
        assert self.peer is not None and self.peer.transport is not None
        self.peer.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.pending.append(data)
        else:
            self._forward(data)

    def eof_received(self) -> bool:
        """Half-close: the other direction may still carry the answer. Once both sides
        have ended theirs, both are closed (False: asyncio closes this one)."""
        self.ended = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.transport.is_closing():
            return False
        if peer.ended or not peer.transport.can_write_eof():
            peer.transport.close()  # after what it still has to write
            return False
        peer.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Front(_Side):
    """The control plane's side: the handshake first, then a ``_Side``."""

    def __init__(self, key: bytes, allowed: Callable[[str], bool]) -> None:
        super().__init__()
        self.key, self.allowed = key, allowed
        self.buf = b""
        self.nonce_r = b""
        self.shaking = True
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        msg, self.nonce_r = wire.hello()
        self.transport.write(msg)
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(wire.HANDSHAKE_TIMEOUT_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if not self.shaking:
            super().data_received(data)
            return
        self.buf += data
        if len(self.buf) < wire.REQUEST_HEAD_BYTES:
            return
        size = self.buf[wire.REQUEST_HEAD_BYTES - 1]
        if len(self.buf) < wire.REQUEST_HEAD_BYTES + size:
            return
        self.shaking = False
        end = wire.REQUEST_HEAD_BYTES + size
        head, rest = self.buf[:end], self.buf[end:]
        self.buf = b""
        if rest:
            self.pending.append(rest)
        self._check(head)

    def _check(self, head: bytes) -> None:
        assert self.transport is not None
        nonce_c = head[: wire.NONCE_BYTES]
        proof = head[wire.NONCE_BYTES : wire.NONCE_BYTES + wire.MAC_BYTES]
        target = head[wire.REQUEST_HEAD_BYTES :]
        if not hmac.compare_digest(
            proof, wire.mac(self.key, b"client", self.nonce_r, nonce_c, target)
        ):
            peer = self.transport.get_extra_info("peername")
            log.warning("relay: refused a connection from %s: it does not hold the key", peer)
            self._answer(None, nonce_c, target, wire.REFUSED)
            return
        ip, _, port = target.decode("ascii", "replace").rpartition(":")
        if not (port.isdigit() and 0 < int(port) < 65536 and self.allowed(ip)):
            log.warning("relay: refused target %s: no env address of this node", target)
            self._answer(self.key, nonce_c, target, wire.NOT_ALLOWED)
            return
        self.transport.pause_reading()  # nothing more until the env side is connected
        task = asyncio.get_running_loop().create_task(self._connect(ip, int(port), nonce_c, target))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _connect(self, ip: str, port: int, nonce_c: bytes, target: bytes) -> None:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, back = await loop.create_connection(_Side, ip, port)
        except (OSError, TimeoutError) as exc:
            log.info("relay: cannot connect to %s:%d (%s)", ip, port, exc)
            self._answer(self.key, nonce_c, target, wire.UNREACHABLE)
            return
        if self.transport.is_closing():
            assert back.transport is not None
            back.transport.close()
            return
        self._answer(self.key, nonce_c, target, wire.OK)
        back.join(self)
        self.join(back)
        self.transport.resume_reading()

    def _answer(self, key: bytes | None, nonce_c: bytes, target: bytes, status: int) -> None:
        assert self.transport is not None
        if self.timer is not None:
            self.timer.cancel()
        self.transport.write(wire.reply(key, self.nonce_r, nonce_c, target, status))
        if status != wire.OK:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        super().connection_lost(exc)


class Relay:
    """The relay of one node: its own event loop in a daemon thread."""

    def __init__(self, key: bytes, allowed: Callable[[str], bool]) -> None:
        self.key, self.allowed = key, allowed
        # asyncio's own loop, whatever the process's policy: Ray's workers install uvloop's
        # where it is installed (uvicorn[standard] brings it), and under it the relay's
        # handshake was answered as by no denv relay.
        self._loop: asyncio.AbstractEventLoop = asyncio.SelectorEventLoop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="denv-relay")
        self._thread.daemon = True

    def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on ``host:port`` (0: a free port); (host, port) it listens on. OSError if
        the port is taken."""
        self._thread.start()
        started: Future[asyncio.Server] = asyncio.run_coroutine_threadsafe(
            self._loop.create_server(lambda: _Front(self.key, self.allowed), host, port),
            self._loop,
        )
        try:
            self._server = started.result(timeout=30)
        except BaseException:
            self.close()
            raise
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    def close(self) -> None:
        """Stop listening and stop the loop (connections in flight are dropped)."""
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
