"""How one API call travels: timeouts, retries, and the answer turned into a value or an error.

The generated client sends every request through one `httpx.Client` built here:

* `RetryTransport` retries what cannot repeat work the server already did: a connection that
  was never made (any call), and 429/5xx answers or a connection that broke mid-call only for
  idempotent calls (GET, DELETE, calls marked idempotent, and POSTs that carry an
  Idempotency-Key, which the facade adds to every create). Backoff is exponential with jitter
  and honors Retry-After. It also maps httpx's transport failures to `Timeout` and
  `ConnectionFailed`.
* `raise_for_status`, a response hook, turns every non-2xx answer into a `DenvError` before
  the generated parser sees it, so a proxy's HTML 502 is as readable as a denv error.
* `unwrap` takes the generated `Response` of a successful call and returns its value.
"""

from __future__ import annotations

import json
import logging
import random
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import metadata
from ipaddress import ip_address
from typing import Any, TypeVar, overload
from urllib.parse import urlsplit

import httpx
from denv_api_client.client import AuthenticatedClient
from denv_api_client.models import Error
from denv_api_client.types import Response

from . import _config
from ._errors import error_from_response, parse_retry_after
from .errors import ConnectionFailed, DenvError, Timeout

logger = logging.getLogger("denv")

T = TypeVar("T")

_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


@dataclass(frozen=True)
class _CallOptions:
    read_timeout_s: float | None = None
    idempotent: bool | None = None


_CALL: ContextVar[_CallOptions | None] = ContextVar("denv_call_options", default=None)


@contextmanager
def call_options(
    *, read_timeout_s: float | None = None, idempotent: bool | None = None
) -> Iterator[None]:
    """Options for the calls made inside the block (the generated API takes no per-call options).

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


def backoff_s(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """Delay before retry number `attempt` (0-based): exponential, capped, half of it jittered."""
    base = min(
        _config.BACKOFF_MAX_S, _config.BACKOFF_INITIAL_S * _config.BACKOFF_MULTIPLIER**attempt
    )
    return base / 2 + rand() * base / 2


def _where(request: httpx.Request) -> str:
    return f"{request.method} {request.url}"


class RetryTransport(httpx.BaseTransport):
    """Sends through `inner`, retrying by the rules in the module docstring."""

    def __init__(
        self,
        inner: httpx.BaseTransport,
        *,
        max_retries: int,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._inner = inner
        self._max_retries = max_retries
        self._sleep = sleep
        self._rand = rand

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        options = _CALL.get()
        if options is not None and options.read_timeout_s is not None:
            request.extensions["timeout"] = {
                **request.extensions.get("timeout", {}),
                "read": options.read_timeout_s,
            }
        idempotent = is_idempotent(request)
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                response = self._inner.handle_request(request)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # The request never left: retrying cannot repeat anything.
                if attempt >= self._max_retries:
                    raise self._connection_failed(request, exc) from exc
                why = f"connection failed ({exc})"
            except httpx.TimeoutException as exc:
                # The server may be working on it; only the caller knows whether to wait longer.
                raise self._timeout(request, exc) from exc
            except httpx.TransportError as exc:
                # The connection broke after the request went out: the server may have acted.
                if not idempotent or attempt >= self._max_retries:
                    raise self._connection_failed(request, exc) from exc
                why = f"connection broke ({exc})"
            else:
                if (
                    response.status_code not in _config.RETRYABLE_STATUSES
                    or not idempotent
                    or attempt >= self._max_retries
                ):
                    return response
                retry_after = parse_retry_after(response.headers.get("retry-after"))
                response.read()
                response.close()
                why = f"HTTP {response.status_code}"
            delay = (
                min(retry_after, _config.RETRY_AFTER_MAX_S)
                if retry_after is not None
                else backoff_s(attempt, self._rand)
            )
            attempt += 1
            logger.info(
                "%s: %s; retry %d of %d in %.2fs",
                _where(request),
                why,
                attempt,
                self._max_retries,
                delay,
            )
            self._sleep(delay)

    def close(self) -> None:
        self._inner.close()

    @staticmethod
    def _connection_failed(request: httpx.Request, exc: Exception) -> ConnectionFailed:
        server = f"{request.url.scheme}://{request.url.netloc.decode()}"
        reason = str(exc) or type(exc).__name__
        return ConnectionFailed(
            f"{_where(request)}: could not reach the denv server at {server} ({reason}): "
            "is it running? Start one with `denv serve`, or point DENV_SERVER at a running one",
            method=request.method,
            url=str(request.url),
        )

    @staticmethod
    def _timeout(request: httpx.Request, exc: Exception) -> Timeout:
        seconds = request.extensions.get("timeout", {}).get("read")
        bound = f"within {seconds:g}s" if isinstance(seconds, int | float) else "in time"
        return Timeout(
            f"{_where(request)}: the denv server did not answer {bound} "
            f"({type(exc).__name__}); pass a larger timeout_s, or check that the server is "
            "healthy (GET /v1/health)",
            method=request.method,
            url=str(request.url),
            timeout_s=float(seconds) if isinstance(seconds, int | float) else None,
        )


def raise_for_status(response: httpx.Response) -> None:
    """Response hook: every non-2xx answer, and any 2xx body that is not JSON, raises here."""
    response.read()
    request = response.request
    status = response.status_code
    if 200 <= status < 300:
        if response.content:
            try:
                json.loads(response.content)
            except ValueError:
                raise DenvError(
                    f"{_where(request)} answered HTTP {status} with a body that is not JSON: is "
                    "DENV_SERVER the URL of a denv server?",
                    status=status,
                ) from None
        return
    raise error_from_response(
        status, response.headers, response.content, method=request.method, url=str(request.url)
    )


@overload
def unwrap(res: Response[T | Error]) -> T: ...
@overload
def unwrap(res: Response[T]) -> T: ...
def unwrap(res: Response[Any]) -> Any:
    """The value of a successful generated-client response, or the `DenvError` it stands for."""
    status = int(res.status_code)
    if not 200 <= status < 300 or isinstance(res.parsed, Error):
        # Only reachable without `raise_for_status` installed; kept so the rule holds anyway.
        raise error_from_response(status, res.headers, res.content, method="", url="request")
    if res.parsed is None:
        raise DenvError(
            f"the server answered HTTP {status}, a status this client does not expect here: "
            "is the server a newer denv than this client?",
            status=status,
        )
    return res.parsed


def unwrap_empty(res: Response[Any]) -> None:
    """Like `unwrap`, for calls that answer 204 No Content."""
    status = int(res.status_code)
    if not 200 <= status < 300:
        raise error_from_response(status, res.headers, res.content, method="", url="request")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def _proxy_for(server: str) -> str | None:
    """The environment's proxy for `server` (none for loopback: a local server is never proxied)."""
    parts = urlsplit(server)
    host = parts.hostname or ""
    if not host or _is_loopback(host) or urllib.request.proxy_bypass(host):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


def _user_agent() -> str:
    try:
        version = metadata.version("denv")
    except metadata.PackageNotFoundError:
        version = "0"
    return f"denv-python/{version}"


def build_http_client(
    server: str,
    api_key: str,
    *,
    timeout_s: float,
    max_retries: int,
    transport: httpx.BaseTransport | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> httpx.Client:
    """The one httpx client a `Denv` sends through. `transport` replaces the network (tests)."""
    inner = transport or httpx.HTTPTransport(proxy=_proxy_for(server))
    headers: dict[str, Any] = {
        "Authorization": f"Bearer {api_key}",
        "User-Agent": _user_agent(),
    }
    return httpx.Client(
        base_url=server,
        headers=headers,
        timeout=httpx.Timeout(timeout_s, connect=min(_config.CONNECT_TIMEOUT_S, timeout_s)),
        transport=RetryTransport(inner, max_retries=max_retries, sleep=sleep),
        event_hooks={"response": [raise_for_status]},
        follow_redirects=False,
        # Proxies come from `_proxy_for` (so retries still apply); no .netrc credentials.
        trust_env=False,
    )


def build_api_client(
    server: str,
    api_key: str,
    *,
    timeout_s: float,
    max_retries: int,
    transport: httpx.BaseTransport | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> AuthenticatedClient:
    """The generated client over `build_http_client` (pass `api_key` as a repr-masked str)."""
    http = build_http_client(
        server,
        api_key,
        timeout_s=timeout_s,
        max_retries=max_retries,
        transport=transport,
        sleep=sleep,
    )
    client = AuthenticatedClient(base_url=server, token=api_key)
    client.set_httpx_client(http)
    return client
