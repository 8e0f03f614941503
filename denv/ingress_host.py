"""The host form of an ingress URL, for browsers: ``http://<label>.localhost:7711/``.

An env's ingress URL has the path form ``http://127.0.0.1:7711/ingress/<token>``: right for
clients, which add their own paths to a base URL. A web app in the env (OpenEnv's Gradio
page at ``/web``) asks for its assets and API at absolute paths (``/web/theme.css``), which
drop the ``/ingress/<token>`` prefix. The host form puts the token in the host name, so the
app sees the whole path as its own, and runs on an origin of its own (never the console's).

A host name is case-insensitive and the token is URL-safe base64 (mixed case), so the label
is the token's bytes in lowercase base32: 39 characters for a 192-bit token. The server
turns it back into the token (``token_of_label``); the label is as much a capability as the
token. ``*.localhost`` resolves to loopback in browsers (RFC 6761); for a server with a DNS
name, ``<label>.<name>`` needs a wildcard record (and certificate).

    web_url("http://127.0.0.1:7711/ingress/su_MUEi0WaJFJjE806ce5e3yGXGZaytm", "/web/")
    # 'http://vl7tfbbctfuynjbhrrhhrzw5xmmq4zm3ywtcrmwf.localhost:7711/web/'
"""

from __future__ import annotations

import base64
import binascii
import re
from ipaddress import ip_address
from urllib.parse import urlsplit

_LABEL_RE = re.compile(r"^[a-z2-7]{16,63}$")
_INGRESS = "/ingress/"
LOOPBACK_NAME = "localhost"


def host_label(token: str) -> str | None:
    """The DNS label of an ingress token, or None when the token is not base64 of whole bytes
    (tokens the server makes always are)."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        return None
    if base64.urlsafe_b64encode(raw).decode().rstrip("=") != token.rstrip("="):
        return None  # not canonical: the label would not give this token back
    label = base64.b32encode(raw).decode().rstrip("=").lower()
    return label if _LABEL_RE.match(label) else None


def token_of_label(label: str) -> str | None:
    """The ingress token a host label stands for, or None when it is not a label."""
    label = label.lower()
    if not _LABEL_RE.match(label):
        return None
    try:
        raw = base64.b32decode(label.upper() + "=" * (-len(label) % 8))
    except (binascii.Error, ValueError):
        return None
    if base64.b32encode(raw).decode().rstrip("=").lower() != label:
        return None  # not canonical (stray bits): no token has this label
    return base64.urlsafe_b64encode(raw).decode()


def host_base(server_host: str) -> str | None:
    """The host name that labels go under for a server at ``server_host``: ``localhost`` for
    a loopback server, its own name for a DNS name; None for another IP address (an address
    has no subdomains)."""
    host = server_host.strip("[]").lower()
    if host == LOOPBACK_NAME:
        return LOOPBACK_NAME
    try:
        address = ip_address(host)
    except ValueError:
        return host or None
    return LOOPBACK_NAME if address.is_loopback else None


def web_url(ingress_url: str, path: str = "/") -> str | None:
    """The host form of a path-form ingress URL, with ``path``; None when it has none (a
    server addressed by a non-loopback IP, or a URL that is not an ingress URL)."""
    parts = urlsplit(ingress_url)
    if _INGRESS not in parts.path or parts.hostname is None:
        return None
    token = parts.path.split(_INGRESS, 1)[1].split("/", 1)[0]
    label = host_label(token)
    base = host_base(parts.hostname)
    if label is None or base is None:
        return None
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{label}.{base}{port}/{path.lstrip('/')}"
