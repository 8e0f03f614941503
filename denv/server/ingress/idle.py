"""The ingress's pooled upstream connections to one env closed as they go idle
(``close_idle_to``): before the env's sandbox is saved, which it cannot be while one is open
(``IngressProxy.close_idle``, ``IngressTable.close_idle``)."""

from __future__ import annotations

import asyncio

import httpcore
import httpx

CLOSE_IDLE_WAIT_S = 1.0  # how long a fork waits for busy ones to be idle


async def close_idle_to(transport: httpx.AsyncHTTPTransport, host: str) -> None:
    """Close the pool's connections to ``host`` as each is idle: one whose response was just
    relayed goes back to the pool a moment later. Those busy past ``CLOSE_IDLE_WAIT_S`` stay."""
    deadline = asyncio.get_running_loop().time() + CLOSE_IDLE_WAIT_S
    while True:
        to_host = [
            conn
            for conn in transport._pool.connections
            if isinstance(origin := getattr(conn, "_origin", None), httpcore.Origin)
            and origin.host == host.encode()  # httpcore's origin: scheme, host and port
        ]
        for conn in to_host:
            if conn.is_idle():
                await conn.aclose()
        if all(c.is_idle() or c.is_closed() for c in to_host):
            return
        if asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.02)
