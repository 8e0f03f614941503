"""How one API call travels: timeouts, retries, and the answer turned into a value or an error.

The generated client sends every request through one `httpx.Client` (`AsyncClient` for
`AsyncDenv`) built here, with the same settings either way:

* `RetryTransport` / `AsyncRetryTransport` (denv/client/_retry.py) retry what cannot repeat work the
  server already did, and map httpx's transport failures to `Timeout` and `ConnectionFailed`.
* `raise_for_status`, a response hook, turns every non-2xx answer into a `DenvError` before
  the generated parser sees it, so a proxy's HTML 502 is as readable as a denv error.
* `unwrap` takes the generated `Response` of a successful call and returns its value.
"""

from __future__ import annotations

import functools
import json
import os
import ssl
import time
import urllib.request
from collections.abc import Awaitable, Callable
from importlib import metadata
from ipaddress import ip_address
from typing import Any, TypeVar, overload
from urllib.parse import urlsplit

import httpx
from denv_api_client.client import AuthenticatedClient
from denv_api_client.models import Error
from denv_api_client.types import Response

from . import _config
from ._errors import error_from_response
from ._retry import AsyncRetryTransport, RetryTransport, where
from .errors import DenvConfigError, DenvError

T = TypeVar("T")


def raise_for_status(response: httpx.Response) -> None:
    """Response hook: every non-2xx answer, and any 2xx body that is not JSON, raises here."""
    response.read()
    check_status(response)


async def araise_for_status(response: httpx.Response) -> None:
    """`raise_for_status` for the async client (its hooks are awaited)."""
    await response.aread()
    check_status(response)


def check_status(response: httpx.Response) -> None:
    """A read response: its `DenvError` if it is not a 2xx JSON answer."""
    request = response.request
    status = response.status_code
    if 200 <= status < 300:
        if response.content:
            try:
                json.loads(response.content)
            except ValueError:
                raise DenvError(
                    f"{where(request)} answered HTTP {status} with a body that is not JSON: is "
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


def proxy_for(server: str) -> str | None:
    """The environment's proxy for `server` (none for loopback: a local server is never proxied)."""
    parts = urlsplit(server)
    host = parts.hostname or ""
    if not host or _is_loopback(host) or urllib.request.proxy_bypass(host):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


@functools.cache  # reading the package's metadata takes milliseconds: once is enough
def _user_agent() -> str:
    try:
        version = metadata.version("denv")
    except metadata.PackageNotFoundError:
        version = "0"
    return f"denv-python/{version}"


@functools.cache
def _default_tls() -> ssl.SSLContext:
    """httpx's default verification (certifi's CAs), built once and shared: building one
    loads every CA certificate (about 70 ms of CPU), which each new client would repeat,
    holding the GIL (an asyncio trainer's loop stalls while many clients are made)."""
    return httpx.create_ssl_context()


def tls_verify(ca_bundle: str | os.PathLike[str] | None = None) -> ssl.SSLContext | bool:
    """How a client checks a TLS server's certificate: against `ca_bundle` (a PEM file),
    else $DENV_CA_BUNDLE, else the CAs httpx trusts by default (True)."""
    path = ca_bundle if ca_bundle is not None else os.environ.get(_config.ENV_CA_BUNDLE) or None
    if path is None:
        return _default_tls()
    try:
        return ssl.create_default_context(cafile=os.fspath(path))
    except (OSError, ssl.SSLError) as exc:
        raise DenvConfigError(
            f"cannot load the CA bundle {os.fspath(path)!r} (ca_bundle or "
            f"{_config.ENV_CA_BUNDLE}): {exc}; give a PEM file of the CA certificates that "
            "signed the server's certificate (for a self-signed one, the certificate itself)"
        ) from exc


def _client_settings(server: str, api_key: str, timeout_s: float) -> dict[str, Any]:
    """What the sync and the async httpx client of a `Denv` share."""
    return {
        "base_url": server,
        "headers": {"Authorization": f"Bearer {api_key}", "User-Agent": _user_agent()},
        "timeout": httpx.Timeout(timeout_s, connect=min(_config.CONNECT_TIMEOUT_S, timeout_s)),
        "follow_redirects": False,
        # Proxies come from `proxy_for` (so retries still apply); no .netrc credentials.
        "trust_env": False,
    }


def build_http_client(
    server: str,
    api_key: str,
    *,
    timeout_s: float,
    max_retries: int,
    transport: httpx.BaseTransport | None = None,
    sleep: Callable[[float], None] = time.sleep,
    verify: ssl.SSLContext | bool = True,
) -> httpx.Client:
    """The one httpx client a `Denv` sends through. `transport` replaces the network (tests);
    `verify` checks a TLS server's certificate (`tls_verify`)."""
    inner = transport or httpx.HTTPTransport(proxy=proxy_for(server), verify=verify)
    return httpx.Client(
        **_client_settings(server, api_key, timeout_s),
        transport=RetryTransport(inner, max_retries=max_retries, sleep=sleep),
        event_hooks={"response": [raise_for_status]},
    )


def build_async_http_client(
    server: str,
    api_key: str,
    *,
    timeout_s: float,
    max_retries: int,
    sleep: Callable[[float], Awaitable[None]],
    transport: httpx.AsyncBaseTransport | None = None,
    verify: ssl.SSLContext | bool = True,
) -> httpx.AsyncClient:
    """`build_http_client` for an `AsyncDenv`."""
    inner = transport or httpx.AsyncHTTPTransport(proxy=proxy_for(server), verify=verify)
    return httpx.AsyncClient(
        **_client_settings(server, api_key, timeout_s),
        transport=AsyncRetryTransport(inner, max_retries=max_retries, sleep=sleep),
        event_hooks={"response": [araise_for_status]},
    )


def api_client(server: str, api_key: str) -> AuthenticatedClient:
    """The generated client, before its httpx client is set (pass `api_key` repr-masked)."""
    return AuthenticatedClient(base_url=server, token=api_key)
