"""Ingress across machines: reaching an env through the relay of its node.

On a cluster of real machines the env networks of a node are routable only on that node. Each
node agent runs a relay (``denv.cluster.relay``) on the node's address; the control plane's
ingress opens a TCP connection to it, both ends prove that they hold the cluster's relay key,
the relay connects to the env's ``ip:port`` on its node and from then on copies bytes both
ways. HTTP and WebSocket go through it unchanged: the relay parses neither, so a request costs
one more TCP hop, and a handshake only when a connection is opened (HTTP connections are
pooled, a WebSocket keeps its one).

An env behind a relay has the address ``<ip>@<relay host>:<relay port>`` (``relayed``) where
a one-machine env has ``<ip>``: the node agent hands it out in ``Booted.agent_ip``, and the
ingress routes keep it as they keep any address.

The handshake (``HELLO``, then ``request``, then ``reply``), with a key of 32 bytes:

    relay -> client   MAGIC nonce_r                        (8 + 32 bytes)
    client -> relay   nonce_c mac_c len target             (32 + 32 + 1 + len bytes)
    relay -> client   status mac_r                         (1 + 32 bytes)

``mac_c = HMAC(key, "client" nonce_r nonce_c target)`` proves the client to the relay;
``mac_r = HMAC(key, "relay" nonce_r nonce_c target status)`` proves the relay to the client
(all zeros when the client's proof failed). Both nonces are fresh per connection, so a proof
seen on the wire is worth nothing on another connection. The key never crosses the wire; what
follows the handshake is not encrypted (as Ray's own traffic is not, unless Ray's TLS is on).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import socket
from typing import Any

import httpcore

MAGIC = b"denvrly1"
NONCE_BYTES = 32
MAC_BYTES = 32
HELLO_BYTES = len(MAGIC) + NONCE_BYTES
REQUEST_HEAD_BYTES = NONCE_BYTES + MAC_BYTES + 1  # then the target, at most 255 bytes
REPLY_BYTES = 1 + MAC_BYTES
OK, REFUSED, NOT_ALLOWED, UNREACHABLE = 0, 1, 2, 3
HANDSHAKE_TIMEOUT_S = 10.0
_SEP = "@"

STATUS_TEXT = {
    REFUSED: "refused the control plane's relay key (do both hold the same cluster token?)",
    NOT_ALLOWED: "refused the target: it is no env address of that node",
    UNREACHABLE: "could not connect to the env (has it stopped?)",
}


class RelayError(OSError):
    """The relay could not be reached, did not prove itself, or refused; says which."""


def relayed(ip: str, relay: str) -> str:
    """The address of an env at ``ip`` behind the relay at ``relay`` ("host:port")."""
    return f"{ip}{_SEP}{relay}"


def split_address(address: str) -> tuple[str, str | None]:
    """(env ip, relay "host:port" or None when the env is reached directly)."""
    ip, sep, relay = address.partition(_SEP)
    return ip, (relay if sep else None)


def relay_host_port(relay: str) -> tuple[str, int]:
    host, _, port = relay.rpartition(":")
    return host.strip("[]"), int(port)


def mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def hello() -> tuple[bytes, bytes]:
    """(the relay's first message, its nonce)."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return MAGIC + nonce, nonce


def request(key: bytes, hello_msg: bytes, target: bytes) -> tuple[bytes, bytes, bytes]:
    """(the client's message, the relay's nonce, the client's nonce) for ``target``."""
    if len(hello_msg) != HELLO_BYTES or not hello_msg.startswith(MAGIC):
        raise RelayError("the relay's port answered, but not as a denv relay")
    nonce_r = hello_msg[len(MAGIC) :]
    nonce_c = secrets.token_bytes(NONCE_BYTES)
    proof = mac(key, b"client", nonce_r, nonce_c, target)
    return nonce_c + proof + bytes([len(target)]) + target, nonce_r, nonce_c


def reply(key: bytes | None, nonce_r: bytes, nonce_c: bytes, target: bytes, status: int) -> bytes:
    """The relay's answer (``key`` None: the client did not prove itself, no proof back)."""
    if key is None:
        return bytes([status]) + bytes(MAC_BYTES)
    return bytes([status]) + mac(key, b"relay", nonce_r, nonce_c, target, bytes([status]))


def check_reply(
    key: bytes, answer: bytes, nonce_r: bytes, nonce_c: bytes, target: bytes, relay: str
) -> None:
    """Nothing if the relay proved itself and connected; RelayError saying why not."""
    if len(answer) != REPLY_BYTES:
        raise RelayError(f"relay {relay} closed the connection during the handshake")
    status = answer[0]
    if status == REFUSED:
        raise RelayError(f"relay {relay} {STATUS_TEXT[REFUSED]}")
    if not hmac.compare_digest(answer[1:], reply(key, nonce_r, nonce_c, target, status)[1:]):
        raise RelayError(f"the service at {relay} did not prove it holds the cluster's relay key")
    if status != OK:
        text = STATUS_TEXT.get(status, f"answered status {status}")
        raise RelayError(f"relay {relay} {text} ({target.decode()})")


async def _recv_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await loop.sock_recv(sock, n - len(data))
        if not chunk:
            break
        data += chunk
    return data


async def open_socket(key: bytes, relay: str, ip: str, port: int) -> socket.socket:
    """A connected socket to ``ip:port`` through ``relay``, its handshake done (for the
    WebSocket client, which takes a socket); RelayError if not."""
    loop = asyncio.get_running_loop()
    host, relay_port = relay_host_port(relay)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        target = f"{ip}:{port}".encode()
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            try:
                await loop.sock_connect(sock, (host, relay_port))
            except OSError as exc:
                raise RelayError(f"cannot reach relay {relay} ({exc.strerror or exc})") from exc
            first = await _recv_exactly(loop, sock, HELLO_BYTES)
            msg, nonce_r, nonce_c = request(key, first, target)
            await loop.sock_sendall(sock, msg)
            answer = await _recv_exactly(loop, sock, REPLY_BYTES)
        check_reply(key, answer, nonce_r, nonce_c, target, relay)
        return sock
    except BaseException:
        sock.close()
        raise


class RelayBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend whose every TCP connection goes through one relay: the
    ingress proxy's HTTP pool for the envs of one node."""

    def __init__(self, key: bytes, relay: str) -> None:
        self.key, self.relay = key, relay
        self._tcp = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        relay_host, relay_port = relay_host_port(self.relay)
        try:
            stream = await self._tcp.connect_tcp(relay_host, relay_port, timeout=timeout)
        except httpcore.ConnectError as exc:
            raise httpcore.ConnectError(f"cannot reach relay {self.relay} ({exc})") from exc
        try:
            target = f"{host}:{port}".encode()
            first = await _read_exactly(stream, HELLO_BYTES, timeout)
            msg, nonce_r, nonce_c = request(self.key, first, target)
            await stream.write(msg, timeout=timeout)
            answer = await _read_exactly(stream, REPLY_BYTES, timeout)
            check_reply(self.key, answer, nonce_r, nonce_c, target, self.relay)
        except BaseException as exc:
            await stream.aclose()
            if isinstance(exc, RelayError):
                raise httpcore.ConnectError(str(exc)) from exc
            raise
        return stream

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("a relay carries TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._tcp.sleep(seconds)


async def _read_exactly(
    stream: httpcore.AsyncNetworkStream, n: int, timeout: float | None
) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await stream.read(n - len(data), timeout=timeout)
        if not chunk:
            break
        data += chunk
    return data
