"""Signing in to the console: the API key in an HttpOnly, SameSite=Strict cookie.

The key is posted once (``POST /ui/session``, JSON body: never in a URL), checked like a
bearer key, and kept by the browser in a cookie that scripts cannot read, that is sent only
to ``/ui`` on this host (never to an env's ingress, which is under ``/ingress`` or on a host
of its own) and never with a request another site starts. Like the API, the console takes a
key only over TLS or from this machine: a plain-HTTP server behind ``--insecure`` refuses
sign-in from elsewhere. A call that changes something also needs the ``X-Denv-Console``
header, which a cross-origin page cannot send without a CORS preflight the server never
allows.
"""

from __future__ import annotations

from ipaddress import ip_address

from fastapi import Request, Response

from denv.server.auth import KeyRing
from denv.server.errors import ApiError

COOKIE = "denv_console"
COOKIE_PATH = "/ui"
CSRF_HEADER = "x-denv-console"
_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_transport(request: Request) -> None:
    """403 unless the request came over TLS or from this machine."""
    client = request.client.host if request.client else None
    if request.url.scheme != "https" and not _loopback(client):
        raise ApiError(
            403,
            "forbidden",
            "the console takes an API key only over TLS or from this machine: serve with "
            "--tls-cert and --tls-key, or open it on the server's own machine",
        )


def check_origin(request: Request) -> None:
    """403 for a call that changes something without the console's own header."""
    if request.method in _UNSAFE and request.headers.get(CSRF_HEADER) != "1":
        raise ApiError(
            403,
            "forbidden",
            "console calls that change something carry 'X-Denv-Console: 1' (the console's "
            "page sends it); use the API with a bearer key from scripts",
        )


def sign_in(request: Request, response: Response, key: str) -> str:
    """Check ``key`` and set the session cookie; the owner id, or 401."""
    check_transport(request)
    check_origin(request)
    ring: KeyRing = request.app.state.keyring
    owner = ring.owner_of(key) if key.startswith("dak_") else None
    if owner is None:
        raise ApiError(401, "unauthorized", "API key not known to this server: check it")
    response.set_cookie(
        COOKIE,
        key,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return owner


def sign_out(response: Response) -> None:
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")


def console_owner(request: Request) -> str:
    """The owner id of the signed-in key (a FastAPI dependency), or 401/403."""
    check_transport(request)
    check_origin(request)
    key = request.cookies.get(COOKIE, "")
    ring: KeyRing = request.app.state.keyring
    owner = ring.owner_of(key) if key.startswith("dak_") else None
    if owner is None:
        raise ApiError(401, "unauthorized", "not signed in: sign in with an API key")
    return owner


def signed_in_owner(request: Request) -> str | None:
    """The owner id of the request's session, or None (no session, or not over TLS or
    loopback): for the page, which is served to everyone."""
    try:
        return console_owner(request)
    except ApiError:
        return None
