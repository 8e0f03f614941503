"""The host form of ingress: ``http://<label>.localhost:7711/web/`` reaches an env's port.

The path form (``/ingress/<token>/...``) suits clients, which join paths to a base URL. Web
apps in an env (OpenEnv's Gradio page at ``/web``) ask for assets and their API at absolute
paths, which drop that prefix; in the host form every path is the env's own, and the page
runs on an origin of its own, apart from the server's API and console. The label is the
token in lowercase base32 (``denv.ingress_host``); the route table, the fairness caps and
the proxy are the path form's.

    app.add_middleware(HostIngress, proxy=app.state.denv_ingress, bases={"localhost"})
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from denv.ingress_host import token_of_label
from denv.server.ingress.wire import HOST_FORM, Receive, Scope, Send, header


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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = self.token(scope) if scope["type"] in ("http", "websocket") else None
        if token is None:
            await self.app(scope, receive, send)
            return
        inner = dict(scope)
        inner["path_params"] = {"token": token}
        inner[HOST_FORM] = True
        await self.proxy(inner, receive, send)
