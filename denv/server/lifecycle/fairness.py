"""Fairness per API key: what one key may hold at once, so it cannot starve another.

Each cap is a ``denv serve`` flag (``config.DEFAULT_MAX_*``; 0 is no cap). A request past one
is refused before any work with 429 and a ``Retry-After`` header, and its message names the
cap and the flag that sets it:

* creates: create, fork, create-from-version, snapshot and deploy requests in flight
  (``rate_limited``, retry after ``RETRY_AFTER_S``);
* starting: envs being created or started (``creating``, ``starting``), checked with the
  live-env quota in ``envs.Envs.create`` (``rate_limited``);
* waits: open ``POST /v1/envs/{id}/wait`` calls (``rate_limited``); also capped for all
  keys together (``--max-waits``): a wait holds a worker thread while it waits, and the
  API's other calls run on the same threads;
* versions: versions not deleted (``quota_exceeded``, freed by deleting versions);
* spares: warm spares the key's envs asked for (``quota_exceeded``);
* ingress: open ingress connections, HTTP requests and WebSockets (``rate_limited``).

A slot is held by the worker thread doing the work, not by the HTTP request: a caller that
disconnects does not free its slot before the thread it started is done. A request that finds
its key's ``creates`` or ``waits`` cap reached first waits up to ``QUEUE_S`` for a slot (on
the event loop, holding no thread), then gets its 429: a client that ignores Retry-After and
asks again at once sends a few requests a second, not hundreds, so its refusals cost the
server, and the keys it shares it with, next to nothing.

    fair = Fairness(config)
    env = await fair.run(owner, "creates", service.create_sandbox, owner, body)
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from denv.server.config import (
    DEFAULT_INGRESS_READ_TIMEOUT_S,
    DEFAULT_MAX_CREATES_PER_KEY,
    DEFAULT_MAX_INGRESS_PER_KEY,
    DEFAULT_MAX_LEASES_PER_KEY,
    DEFAULT_MAX_SPARES_PER_KEY,
    DEFAULT_MAX_STARTING_PER_KEY,
    DEFAULT_MAX_VERSIONS_PER_KEY,
    DEFAULT_MAX_WAITS,
    DEFAULT_MAX_WAITS_PER_KEY,
    DEFAULT_WS_IDLE_TIMEOUT_S,
    ServerConfig,
)
from denv.server.errors import QUOTA_RETRY_AFTER_S, RETRY_AFTER_S, ApiError

T = TypeVar("T")
QUEUE_S = 1.0  # how long a request past a creates/waits cap waits for a slot before its 429
_POLL_S = 0.05
Kind = Literal["creates", "waits", "ingress"]

_WHAT: dict[str, tuple[str, str]] = {  # kind -> (what is counted, the flag that sets its cap)
    "creates": ("create, fork, snapshot or deploy requests in flight", "--max-creates-per-key"),
    "waits": ("open waits (POST /v1/envs/{id}/wait)", "--max-waits-per-key"),
    "ingress": ("open ingress connections", "--max-ingress-per-key"),
    "starting": ("envs starting", "--max-starting-per-key"),
}


def throttled(kind: str, held: int, cap: int) -> ApiError:
    """429 ``rate_limited``: the key holds ``held`` of ``cap``; it frees on its own soon."""
    what, flag = _WHAT[kind]
    return ApiError(
        429,
        "rate_limited",
        f"this API key has {held} {what}, the server's limit is {cap} ({flag}): retry after "
        f"{RETRY_AFTER_S} s, or send fewer at once",
        {"limit": kind, "max": cap, "retry_after_s": RETRY_AFTER_S},
    )


def server_busy(kind: str, held: int, cap: int) -> ApiError:
    """429 ``rate_limited``: every key together holds ``held`` of the server's ``cap``."""
    what, _ = _WHAT[kind]
    return ApiError(
        429,
        "rate_limited",
        f"the server has {held} {what} from all API keys, its limit is {cap} (--max-{kind}): "
        f"retry after {RETRY_AFTER_S} s",
        {"limit": f"server_{kind}", "max": cap, "retry_after_s": RETRY_AFTER_S},
    )


def over_quota(kind: str, message: str, cap: int) -> ApiError:
    """429 ``quota_exceeded``: freed only when the key deletes something."""
    return ApiError(
        429,
        "quota_exceeded",
        message,
        {"limit": kind, "max": cap, "retry_after_s": QUOTA_RETRY_AFTER_S},
    )


class Fairness:
    """Counts the slots each key has in use; thread-safe, no I/O."""

    def __init__(self, config: ServerConfig) -> None:
        self._caps: dict[str, int] = {
            "creates": config.max_creates_per_key,
            "waits": config.max_waits_per_key,
            "ingress": config.max_ingress_per_key,
        }
        self._server_caps: dict[str, int] = {"waits": config.max_waits}  # all keys together
        self._lock = threading.Lock()
        self._in_use: Counter[tuple[str, str]] = Counter()
        self._total: Counter[str] = Counter()

    def in_use(self, owner: str, kind: Kind) -> int:
        with self._lock:
            return self._in_use[(kind, owner)]

    def acquire(self, owner: str, kind: Kind) -> None:
        """Take one slot of ``kind`` for ``owner``, or raise 429 when its cap is reached."""
        cap = self._caps[kind]
        server_cap = self._server_caps.get(kind, 0)
        with self._lock:
            held = self._in_use[(kind, owner)]
            if cap and held >= cap:
                raise throttled(kind, held, cap)
            if server_cap and self._total[kind] >= server_cap:
                raise server_busy(kind, self._total[kind], server_cap)
            self._in_use[(kind, owner)] = held + 1
            self._total[kind] += 1

    def try_acquire(self, owner: str, kind: Kind) -> bool:
        try:
            self.acquire(owner, kind)
        except ApiError:
            return False
        return True

    def release(self, owner: str, kind: Kind) -> None:
        with self._lock:
            self._in_use[(kind, owner)] -= 1
            self._total[kind] -= 1
            if self._in_use[(kind, owner)] <= 0:
                del self._in_use[(kind, owner)]

    async def run(self, owner: str, kind: Kind, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` on a worker thread holding one slot of ``kind`` while it runs."""
        await self._acquire_soon(owner, kind)
        state = {"started": False, "released": False}
        lock = threading.Lock()

        def release_once() -> None:
            with lock:
                if state["released"]:
                    return
                state["released"] = True
            self.release(owner, kind)

        def work() -> T:
            state["started"] = True
            try:
                return fn(*args)
            finally:
                release_once()

        try:
            return await asyncio.to_thread(work)
        except asyncio.CancelledError:
            if not state["started"]:  # cancelled in the executor's queue: it never runs
                release_once()
            raise

    async def _acquire_soon(self, owner: str, kind: Kind) -> None:
        """:meth:`acquire`, waiting up to ``QUEUE_S`` for a slot before the 429."""
        deadline = asyncio.get_running_loop().time() + QUEUE_S
        while not self.try_acquire(owner, kind):
            if asyncio.get_running_loop().time() >= deadline:
                self.acquire(owner, kind)  # raises the 429 (or takes a slot freed just now)
                return
            await asyncio.sleep(_POLL_S)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The fairness options of ``denv serve`` (0 turns a cap off)."""
    flags = [
        ("--max-starting-per-key", DEFAULT_MAX_STARTING_PER_KEY, "envs being created or started"),
        (
            "--max-creates-per-key",
            DEFAULT_MAX_CREATES_PER_KEY,
            "create, fork, snapshot and deploy requests in flight",
        ),
        ("--max-waits-per-key", DEFAULT_MAX_WAITS_PER_KEY, "open waits"),
        ("--max-versions-per-key", DEFAULT_MAX_VERSIONS_PER_KEY, "versions not deleted"),
        ("--max-spares-per-key", DEFAULT_MAX_SPARES_PER_KEY, "warm spares its envs ask for"),
        ("--max-ingress-per-key", DEFAULT_MAX_INGRESS_PER_KEY, "open ingress connections"),
        ("--max-leases-per-key", DEFAULT_MAX_LEASES_PER_KEY, "open leases (one per client)"),
    ]
    parser.add_argument(
        "--max-waits",
        type=int,
        default=DEFAULT_MAX_WAITS,
        metavar="N",
        help="open waits of all API keys together (each holds a worker thread while it "
        "waits); past it 429 with Retry-After; 0: no cap (default %(default)s)",
    )
    for flag, default, what in flags:
        parser.add_argument(
            flag,
            type=int,
            default=default,
            metavar="N",
            help=f"{what} per API key at once; past it 429 with Retry-After; 0: no cap "
            "(default %(default)s)",
        )
    parser.add_argument(
        "--ingress-read-timeout",
        type=float,
        default=DEFAULT_INGRESS_READ_TIMEOUT_S,
        metavar="S",
        help="seconds an env may send nothing in the middle of a response through ingress "
        "before the proxy gives up; 0: none (default %(default)g)",
    )
    parser.add_argument(
        "--ws-idle-timeout",
        type=float,
        default=DEFAULT_WS_IDLE_TIMEOUT_S,
        metavar="S",
        help="close a WebSocket through ingress after this many seconds with no message "
        "either way and no ping from its client (OpenEnv's clients ping every 20 s); "
        "0: none (default %(default)g)",
    )


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ``ServerConfig`` fields of the options above; ValueError for a negative one."""
    fields: dict[str, Any] = {
        "max_starting_per_key": args.max_starting_per_key,
        "max_creates_per_key": args.max_creates_per_key,
        "max_waits_per_key": args.max_waits_per_key,
        "max_waits": args.max_waits,
        "max_versions_per_key": args.max_versions_per_key,
        "max_spares_per_key": args.max_spares_per_key,
        "max_ingress_per_key": args.max_ingress_per_key,
        "max_leases_per_key": args.max_leases_per_key,
        "ingress_read_timeout_s": args.ingress_read_timeout,
        "ws_idle_timeout_s": args.ws_idle_timeout,
    }
    negative = [name for name, value in fields.items() if value < 0]
    if negative:
        flags = ", ".join("--" + n.removesuffix("_s").replace("_", "-") for n in negative)
        raise ValueError(f"{flags}: give 0 (no cap) or more")
    return fields
