"""What the ingress proxy puts on the wire: paths, forwarded headers, Error bodies, redaction.

Shared by the HTTP (``proxy``) and WebSocket (``websocket``) halves of the proxy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from denv.redaction import RedactSecrets
from denv.server.auth import holds_api_key
from denv.server.ids import new_id

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
Resolve = Callable[[str], "tuple[str, int] | None"]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

NOT_FOUND_MESSAGE = (
    "no env is reachable at this ingress URL: the env was deleted or the URL is wrong; "
    "take the current URL from the env's endpoints (GET /v1/envs/{id})"
)


def upstream_down_message(port: int) -> str:
    return (
        f"the env's service is not answering on port {port}: it may still be starting, "
        "have exited, or not listen on that port; check the env's status and logs "
        "(GET /v1/envs/{id}, GET /v1/envs/{id}/logs)"
    )


def no_relay_key_message(relay: str) -> str:
    return (
        f"the env runs behind the node relay at {relay}, and this server holds no relay key: "
        "run denv serve --cluster with the cluster's Ray token (RAY_AUTH_MODE=token, "
        "RAY_AUTH_TOKEN_PATH; docs/cluster.md)"
    )


def error_body(scope: Scope, code: str, message: str) -> tuple[Headers, bytes]:
    """Headers and body of the contract's ``Error`` JSON (request id from the scope if set)."""
    state = scope.get("state")
    rid = state.get("request_id") if isinstance(state, dict) else None
    if not isinstance(rid, str):
        rid = new_id("req")
    body = json.dumps(
        {"code": code, "message": message, "request_id": rid, "details": None}
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    return headers, body


async def send_error(send: Send, scope: Scope, status: int, code: str, message: str) -> None:
    """Answer an HTTP request with an ``Error`` body."""
    headers, body = error_body(scope, code, message)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def header(headers: Headers, name: bytes) -> bytes | None:
    """The first value of a (lowercase) header, or None."""
    for key, value in headers:
        if key == name:
            return value
    return None


#: The scope key that marks a request of the host form (``ingress.hosts``): the whole path
#: is the env's, nothing is a prefix.
HOST_FORM = "denv.ingress_host_form"

#: Sent with every response of the path form, which shares the server's origin (and the
#: console's, ``/ui``): a page an env serves there runs in an opaque origin, so its scripts
#: can read neither the console nor its cookie-signed calls. Browsers use the host form.
PATH_FORM_CSP = b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"


def split_target(scope: Scope) -> tuple[str, str]:
    """(token, upstream path) of an ingress request, the path still percent-encoded."""
    token = str(scope["path_params"]["token"])
    raw = scope.get("raw_path")
    if scope.get(HOST_FORM):
        path = raw.decode("latin-1") if isinstance(raw, bytes) else str(scope.get("path", "/"))
        return token, path or "/"
    if isinstance(raw, bytes) and raw.startswith(b"/ingress/"):
        parts = raw.split(b"/", 3)
        rest = parts[3].decode("latin-1") if len(parts) > 3 else ""
    else:
        rest = str(scope["path_params"].get("path", ""))
    # A base URL with a trailing slash plus "/ws" gives "//ws": the env means "/ws".
    return token, "/" + rest.lstrip("/")


def _connection_listed(headers: Headers) -> set[bytes]:
    drop = set(HOP_BY_HOP)
    for name, value in headers:
        if name.lower() == b"connection":
            drop.update(v.strip().lower() for v in value.split(b","))
    return drop


def forward_headers(scope: Scope, host: str, port: int, *, websocket: bool) -> Headers:
    """The client's end-to-end headers as the env's service should see them.

    Drops hop-by-hop headers (and those the client's Connection header names), sets Host
    to the upstream (HTTP; the WebSocket client sets its own), adds X-Forwarded-For/-Host/
    -Proto, and drops an Authorization that carries a denv API key (``Bearer dak_...``,
    whatever its case or spacing, as ``auth`` accepts it): the key is for the server,
    never for the env.
    """
    out: Headers = []
    drop = _connection_listed(scope["headers"])
    original_host = b""
    forwarded_for = b""
    for name, value in scope["headers"]:
        if name in drop:
            continue
        if name == b"host":
            original_host = value
        elif name == b"authorization" and holds_api_key(value):
            continue
        elif name == b"x-forwarded-for":
            forwarded_for = value + b", "
        elif websocket and (name.startswith(b"sec-websocket-") or name == b"user-agent"):
            continue  # the upstream handshake makes its own (user agent: see websocket.py)
        elif name == b"expect":
            continue  # the server side already answered 100-continue; the body follows
        else:
            out.append((name, value))
    if not websocket:
        out.append((b"host", f"{host}:{port}".encode()))
    client = scope.get("client")
    if client:
        out.append((b"x-forwarded-for", forwarded_for + str(client[0]).encode()))
    if original_host:
        out.append((b"x-forwarded-host", original_host))
    scheme = str(scope.get("scheme", "http"))
    proto = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    out.append((b"x-forwarded-proto", proto.encode()))
    return out


def response_headers(raw: Headers, scope: Scope, host: str, port: int) -> Headers:
    """The env's response headers as the client should see them (lowercase names)."""
    out: Headers = []
    drop = _connection_listed(raw)
    for name, value in raw:
        lname = name.lower()
        if lname in drop:
            continue
        if lname == b"location":
            value = rewrite_location(value, scope, host, port)
        out.append((lname, value))
    if not scope.get(HOST_FORM):
        out.append((b"content-security-policy", PATH_FORM_CSP))
    return out


def rewrite_location(value: bytes, scope: Scope, host: str, port: int) -> bytes:
    """Point a redirect back through the ingress prefix instead of at the container."""
    raw = scope.get("raw_path")
    prefix = b"/".join(raw.split(b"/", 3)[:3]) if isinstance(raw, bytes) else b""
    if scope.get(HOST_FORM):
        prefix = b""  # the env's paths are the host's own
    elif not prefix.startswith(b"/ingress/"):
        return value
    upstream = f"http://{host}:{port}".encode()
    if value == upstream or value.startswith(upstream + b"/"):
        return prefix + (value[len(upstream) :] or b"/")
    if value.startswith(b"/") and not value.startswith(b"//"):
        return prefix + value
    return value


REDACT = RedactSecrets()


def install_log_redaction() -> None:
    """Redact ingress tokens from uvicorn's access and WebSocket log lines (idempotent).

    For any server that mounts the proxy, whatever handlers it logs to; ``denv serve`` also
    redacts every record its own handlers write (``denv.server.serve_cli``)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if REDACT not in logger.filters:
            logger.addFilter(REDACT)
