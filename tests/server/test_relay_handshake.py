"""The node relay's handshake and its copying, on loopback without a cluster (issue 27).

A real ``Relay`` (its own event loop and thread, as in a node agent) in front of a TCP echo
service standing in for an env; the client is the ingress's own ``open_socket``. What the
cluster tests (tests/cluster/test_relay.py) show end to end through ``denv serve --cluster``,
this shows at the edges: who is refused, that a refused client never reaches the env, that a
service pretending to be a relay is refused by the control plane, that half-closes cross.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from denv.cluster.relay import Relay, env_addresses, with_live_children
from denv.server.docker.live import host_routes
from denv.server.ingress import relay as wire
from denv.server.ingress.relay import RelayError, open_socket

KEY = secrets.token_bytes(32)


class EchoEnv:
    """A TCP service that answers each line upper-cased and counts its connections."""

    def __init__(self) -> None:
        self.accepted = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        data = await reader.read()  # until the client's EOF: a half-close crossed
        writer.write(data.upper())
        await writer.drain()
        writer.close()


@pytest.fixture
def relay() -> Iterator[str]:
    r = Relay(KEY, lambda ip: ip == "127.0.0.1")
    host, port = r.start("127.0.0.1", 0)
    try:
        yield f"{host}:{port}"
    finally:
        r.close()


async def _through(relay: str, key: bytes, env: EchoEnv, payload: bytes) -> bytes:
    server = await asyncio.start_server(env.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    try:
        sock = await open_socket(key, relay, "127.0.0.1", port)
        try:
            await loop.sock_sendall(sock, payload)
            sock.shutdown(1)  # SHUT_WR: the client's half-close
            answer = b""
            while chunk := await loop.sock_recv(sock, 65536):
                answer += chunk
            return answer
        finally:
            sock.close()
    finally:
        server.close()
        await server.wait_closed()


def test_with_the_key_bytes_cross_both_ways_and_half_closes_too(relay: str) -> None:
    env = EchoEnv()
    big = b"x" * (4 << 20)  # more than any socket buffer: back-pressure on the way
    assert asyncio.run(_through(relay, KEY, env, b"hello\n" + big)) == b"HELLO\n" + big.upper()
    assert env.accepted == 1


def test_without_the_key_the_relay_refuses_and_never_reaches_the_env(relay: str) -> None:
    env = EchoEnv()
    with pytest.raises(RelayError, match="refused the control plane's relay key"):
        asyncio.run(_through(relay, secrets.token_bytes(32), env, b"hello"))
    assert env.accepted == 0


def test_with_the_key_only_env_addresses_open(relay: str) -> None:
    async def go() -> None:
        await open_socket(KEY, relay, "10.255.255.1", 80)

    with pytest.raises(RelayError, match="no env address of that node"):
        asyncio.run(go())


def test_a_service_without_the_key_is_no_relay_to_the_control_plane() -> None:
    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(wire.hello()[0])
        await reader.readexactly(wire.REQUEST_HEAD_BYTES)
        writer.write(bytes([wire.OK]) + bytes(wire.MAC_BYTES))  # "connected", unproven
        await writer.drain()
        await asyncio.sleep(1)
        writer.close()

    async def go() -> None:
        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            await open_socket(KEY, f"127.0.0.1:{port}", "172.30.0.2", 8000)
        finally:
            server.close()

    with pytest.raises(RelayError, match="did not prove it holds the cluster's relay key"):
        asyncio.run(go())


def test_env_addresses_are_the_pool_less_each_subnets_own() -> None:
    allowed = env_addresses("172.30.0.0/16", 28)
    assert allowed("172.30.0.2") and allowed("172.30.1.18")
    assert not allowed("172.30.0.1")  # a gateway: the node itself
    assert not allowed("172.30.0.0") and not allowed("172.30.0.15")
    assert not allowed("127.0.0.1") and not allowed("10.0.0.5") and not allowed("nonsense")


def test_live_children_are_admitted_through_their_containers_address(tmp_path: Path) -> None:
    """A live child in a network namespace of its own (``denv serve --live-netns``) has an
    address of ``netns.SUBNETS``, routed by the host through its container's: admitted
    when that container's address is one of the node's envs, never otherwise. The route
    table is the kernel's format (/proc/net/route: hex in the host's byte order); the
    real table is read in tests/server/test_live_net.py."""

    def le(ip: str) -> str:
        return f"{struct.unpack('=I', ipaddress.IPv4Address(ip).packed)[0]:08X}"

    table = tmp_path / "route"
    head = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    rows = [  # iface, destination, gateway, mask
        ("eth0", "0.0.0.0", "192.0.2.1", "0.0.0.0"),  # the default route
        ("br-1", "100.64.4.0", "172.30.0.2", "255.255.252.0"),  # an env's children
        ("br-2", "100.64.8.0", "10.9.9.9", "255.255.252.0"),  # via no env of this node
        ("br-3", "100.127.0.0", "0.0.0.0", "255.255.252.0"),  # a link, not via a container
    ]
    table.write_text(
        head
        + "".join(
            f"{i}\t{le(d)}\t{le(g)}\t0003\t0\t0\t0\t{le(m)}\t0\t0\t0\n" for i, d, g, m in rows
        )
    )
    assert host_routes.routed_via("100.64.5.7", str(table)) == "172.30.0.2"
    assert host_routes.routed_via("100.64.4.1", str(table)) is None  # the bridge's own
    assert host_routes.routed_via("100.64.9.7", str(table)) == "10.9.9.9"
    assert host_routes.routed_via("100.127.0.5", str(table)) is None
    assert host_routes.routed_via("100.65.0.5", str(table)) is None  # no route
    assert host_routes.routed_via("10.0.0.5", str(table)) is None  # not a child's range

    allowed = with_live_children(env_addresses("172.30.0.0/16", 28), str(table))
    assert allowed("172.30.0.2") and allowed("100.64.5.7")  # an env; a child of one
    assert not allowed("100.64.9.7")  # routed through an address that is no env here
    assert not allowed("100.64.4.1") and not allowed("100.65.0.5")
    assert not allowed("127.0.0.1") and not allowed("nonsense")
