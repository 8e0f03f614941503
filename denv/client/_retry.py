"""Retries, for the sync and the async client alike: one policy, two thin transports.

What is retried cannot repeat work the server already did: a connection that was never made
(any call), and 429/5xx answers or a connection that broke mid-call only for idempotent calls
(GET, DELETE, calls marked idempotent, and POSTs that carry an Idempotency-Key, which the
facade adds to every create). Backoff is exponential with jitter and honors Retry-After.
A 429 `quota_exceeded` (too many envs, versions or warm spares) is never retried: it
frees only when the caller deletes something, however long it waits. A 429 `rate_limited`
(too much of a key's work in flight) is waited out: retried after its Retry-After up to
`RATE_LIMITED_MAX_RETRIES` times, so a burst of creates queues instead of failing.
httpx's transport failures become `Timeout` and `ConnectionFailed`.

`RetryPolicy` decides, for one attempt's outcome, whether to return, raise or wait and retry;
`RetryTransport` and `AsyncRetryTransport` only send, read and sleep, each in its own way.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import httpx

from . import _config
from ._errors import cannot_reach, parse_retry_after
from .errors import ConnectionFailed, Timeout

logger = logging.getLogger("denv")

_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


@dataclass(frozen=True)
class _CallOptions:
    read_timeout_s: float | None = None
    idempotent: bool | None = None


# A context variable, so options reach the transport through the generated client (which
# takes no per-call options) and stay with their call across an asyncio task's awaits.
_CALL: ContextVar[_CallOptions | None] = ContextVar("denv_call_options", default=None)


@contextmanager
def call_options(
    *, read_timeout_s: float | None = None, idempotent: bool | None = None
) -> Iterator[None]:
    """Options for the calls made inside the block.

    `read_timeout_s` replaces the client's read timeout (long-polls wait longer than a plain
    call); `idempotent=True` marks a POST as safe to retry (wait).
    """
    token = _CALL.set(_CallOptions(read_timeout_s, idempotent))
    try:
        yield
    finally:
        _CALL.reset(token)


def is_idempotent(request: httpx.Request) -> bool:
    """Whether repeating `request` cannot repeat work the server already did."""
    options = _CALL.get()
    if options is not None and options.idempotent is not None:
        return options.idempotent
    return request.method in _IDEMPOTENT_METHODS or "idempotency-key" in request.headers


def is_quota(response: httpx.Response) -> bool:
    """Whether a (read) response is a 429 `quota_exceeded`, which waiting does not clear."""
    if response.status_code != 429:
        return False
    try:
        body = json.loads(response.content)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("code") == "quota_exceeded"


def is_rate_limited(response: httpx.Response) -> bool:
    """Whether a (read) response is a 429 `rate_limited`: work in flight, clears by waiting."""
    if response.status_code != 429:
        return False
    try:
        body = json.loads(response.content)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("code") == "rate_limited"


def backoff_s(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """Delay before retry number `attempt` (0-based): exponential, capped, half of it jittered."""
    base = min(
        _config.BACKOFF_MAX_S, _config.BACKOFF_INITIAL_S * _config.BACKOFF_MULTIPLIER**attempt
    )
    return base / 2 + rand() * base / 2


def where(request: httpx.Request) -> str:
    return f"{request.method} {request.url}"


def _server(request: httpx.Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc.decode()}"


class RetryPolicy:
    """The retry rules of the module docstring, for one client."""

    def __init__(self, max_retries: int, rand: Callable[[], float] = random.random) -> None:
        self.max_retries = max_retries
        self._rand = rand

    @staticmethod
    def prepare(request: httpx.Request) -> None:
        """Apply the call's options (a long-poll's read timeout) to `request`."""
        options = _CALL.get()
        if options is not None and options.read_timeout_s is not None:
            request.extensions["timeout"] = {
                **request.extensions.get("timeout", {}),
                "read": options.read_timeout_s,
            }

    def retry_delay(
        self, request: httpx.Request, outcome: httpx.Response | Exception, attempt: int
    ) -> float | None:
        """Seconds to wait before retrying `attempt`'s outcome; None to return the response.

        Raises the `DenvError` a transport failure stands for when it is not retried.
        """
        retry_after: float | None = None
        if isinstance(outcome, httpx.Response):
            limit = self.max_retries
            if is_rate_limited(outcome):  # back-pressure: wait our turn
                limit = max(limit, _config.RATE_LIMITED_MAX_RETRIES)
            if (
                outcome.status_code not in _config.RETRYABLE_STATUSES
                or not is_idempotent(request)
                or attempt >= limit
                or is_quota(outcome)
            ):
                return None
            retry_after = parse_retry_after(outcome.headers.get("retry-after"))
            why = f"HTTP {outcome.status_code}"
        elif isinstance(outcome, httpx.ConnectError | httpx.ConnectTimeout):
            # The request never left: retrying cannot repeat anything.
            if attempt >= self.max_retries:
                raise cannot_reach(
                    _server(request), outcome, method=request.method, url=str(request.url)
                ) from outcome
            why = f"connection failed ({outcome})"
        elif isinstance(outcome, httpx.TimeoutException):
            # The server may be working on it; only the caller knows whether to wait longer.
            raise self._timeout(request, outcome) from outcome
        elif isinstance(outcome, httpx.TransportError):
            # The connection broke after the request went out: the server may have acted.
            if not is_idempotent(request) or attempt >= self.max_retries:
                raise self._connection_failed(request, outcome) from outcome
            why = f"connection broke ({outcome})"
        else:
            raise outcome
        delay = (
            min(retry_after, _config.RETRY_AFTER_MAX_S)
            if retry_after is not None
            else backoff_s(attempt, self._rand)
        )
        logger.info(
            "%s: %s; retry %d of %d in %.2fs",
            where(request),
            why,
            attempt + 1,
            self.max_retries,
            delay,
        )
        return delay

    @staticmethod
    def _connection_failed(request: httpx.Request, exc: Exception) -> ConnectionFailed:
        reason = str(exc) or type(exc).__name__
        return ConnectionFailed(
            f"{where(request)}: the connection to the denv server at {_server(request)} broke "
            f"before its answer ({reason}): check that the server is healthy (GET /v1/health)",
            method=request.method,
            url=str(request.url),
        )

    @staticmethod
    def _timeout(request: httpx.Request, exc: Exception) -> Timeout:
        seconds = request.extensions.get("timeout", {}).get("read")
        bound = f"within {seconds:g}s" if isinstance(seconds, int | float) else "in time"
        return Timeout(
            f"{where(request)}: the denv server did not answer {bound} "
            f"({type(exc).__name__}); pass a larger timeout_s, or check that the server is "
            "healthy (GET /v1/health)",
            method=request.method,
            url=str(request.url),
            timeout_s=float(seconds) if isinstance(seconds, int | float) else None,
        )


class RetryTransport(httpx.BaseTransport):
    """Sends through `inner`, retrying by `RetryPolicy`."""

    def __init__(
        self,
        inner: httpx.BaseTransport,
        *,
        max_retries: int,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._inner = inner
        self._policy = RetryPolicy(max_retries, rand)
        self._sleep = sleep

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self._policy.prepare(request)
        attempt = 0
        while True:
            outcome: httpx.Response | Exception
            try:
                outcome = self._inner.handle_request(request)
                if outcome.status_code == 429:
                    outcome.read()  # its code says whether waiting can help (is_quota)
            except httpx.TransportError as exc:
                outcome = exc
            delay = self._policy.retry_delay(request, outcome, attempt)
            if delay is None:
                assert isinstance(outcome, httpx.Response)
                return outcome
            if isinstance(outcome, httpx.Response):
                outcome.read()
                outcome.close()
            attempt += 1
            self._sleep(delay)

    def close(self) -> None:
        self._inner.close()


class AsyncRetryTransport(httpx.AsyncBaseTransport):
    """`RetryTransport` for `httpx.AsyncClient`: the same policy, awaiting instead of blocking."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        *,
        max_retries: int,
        sleep: Callable[[float], Awaitable[None]],
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._inner = inner
        self._policy = RetryPolicy(max_retries, rand)
        self._sleep = sleep

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self._policy.prepare(request)
        attempt = 0
        while True:
            outcome: httpx.Response | Exception
            try:
                outcome = await self._inner.handle_async_request(request)
                if outcome.status_code == 429:
                    await outcome.aread()  # its code says whether waiting can help (is_quota)
            except httpx.TransportError as exc:
                outcome = exc
            delay = self._policy.retry_delay(request, outcome, attempt)
            if delay is None:
                assert isinstance(outcome, httpx.Response)
                return outcome
            if isinstance(outcome, httpx.Response):
                await outcome.aread()
                await outcome.aclose()
            attempt += 1
            await self._sleep(delay)

    async def aclose(self) -> None:
        await self._inner.aclose()
