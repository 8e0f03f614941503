"""The host form of ingress: ``http://<label>.localhost:7711/web/`` reaches an env's port.

The path form (``/ingress/<token>/...``) suits clients, which join paths to a base URL. Web
apps in an env (OpenEnv's Gradio page at ``/web``) ask for assets and their API at absolute
paths, which drop that prefix; in the host form every path is the env's own, and the page
runs on an origin of its own, apart from the server's API and console. The label is the
token in lowercase base32 (``denv.ingress_host``); the route table, the fairness caps and
the proxy are the path form's.

A browser that opens a page at the path form (a client's base URL plus ``/web/``) is sent
to the same path on the host form (307): there the page's absolute paths reach the env, and
its scripts run on their own origin, not in the path form's sandbox. Only navigations are
moved (``Sec-Fetch-Mode: navigate``, which browsers send and clients do not), and only to a
host this middleware serves; everything else of the path form is proxied as it was.

    app.add_middleware(HostIngress, proxy=app.state.denv_ingress, bases={"localhost"})
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any
from urllib.parse import urlsplit

from denv.ingress_host import token_of_label, web_url
from denv.server.ingress.wire import HOST_FORM, Receive, Scope, Send, header

_PATH_FORM = b"/ingress/"


def split_host(value: bytes) -> tuple[str, str] | None:
    """(first label, the rest) of a Host header value without its port."""
    host = value.decode("latin-1").lower()
    if host.startswith("["):
        return None  # an IPv6 address has no labels
    name = host.rsplit(":", 1)[0] if ":" in host else host
    label, dot, rest = name.partition(".")
    return (label, rest.rstrip(".")) if dot else None


class HostIngress:
    """ASGI middleware: a request to ``<label>.<base>`` goes to the ingress proxy, whole."""

    def __init__(self, app: Any, proxy: Any, bases: Collection[str]) -> None:
        self.app = app
        self.proxy = proxy
        self.bases = frozenset(b.lower() for b in bases)

    def token(self, scope: Scope) -> str | None:
        """The ingress token named by the request's host, or None (not the host form)."""
        value = header(list(scope.get("headers") or []), b"host")
        parts = split_host(value) if value else None
        if parts is None or parts[1] not in self.bases:
            return None
        return token_of_label(parts[0])

    def page_moved_to(self, scope: Scope) -> str | None:
        """The host-form URL of a browser's navigation to a path-form URL, or None (not
        one, or no host form this middleware serves: a server addressed by another IP)."""
        headers = list(scope.get("headers") or [])
        raw = scope.get("raw_path")
        host = header(headers, b"host")
        if (
            scope["type"] != "http"
            or scope.get("method") not in ("GET", "HEAD")
            or header(headers, b"sec-fetch-mode") != b"navigate"
            or not isinstance(raw, bytes)
            or not raw.startswith(_PATH_FORM)
            or not host
        ):
            return None
        parts = raw.split(b"/", 3)  # "", "ingress", token, the env's path
        base = f"{scope.get('scheme', 'http')}://{host.decode('latin-1')}/ingress/"
        path = "/" + (parts[3].decode("latin-1") if len(parts) > 3 else "")
        query = scope.get("query_string") or b""
        if query:
            path += "?" + query.decode("latin-1")
        url = web_url(base + parts[2].decode("latin-1"), path)
        moved = split_host(urlsplit(url).netloc.encode("latin-1")) if url else None
        return url if moved is not None and moved[1] in self.bases else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = self.token(scope) if scope["type"] in ("http", "websocket") else None
        if token is None:
            moved = self.page_moved_to(scope)
            if moved is not None:
                await _redirect(send, moved)
                return
            await self.app(scope, receive, send)
            return
        inner = dict(scope)
        inner["path_params"] = {"token": token}
        inner[HOST_FORM] = True
        await self.proxy(inner, receive, send)


async def _redirect(send: Send, url: str) -> None:
    headers = [
        (b"location", url.encode("latin-1")),
        (b"content-length", b"0"),
        (b"cache-control", b"no-store"),  # the env may be gone, and its token with it
    ]
    await send({"type": "http.response.start", "status": 307, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
