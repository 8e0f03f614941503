"""The ingress route table: which token reaches which env's ``host:port``, and for whom.

Apart from the proxy (``ingress.proxy``), which only reads it per request, because the
lifecycle writes it (through ``Context``'s view of it) and tests build one on its own. The
table keys its dict by the token's SHA-256 digest: a lookup is one hash and one dict probe
whose timing depends only on the digest, which a caller cannot steer towards a registered
token (no guessing prefix by prefix); the database's refs (``sha256:<hex>``) register as
the same keys.

    table = IngressTable()
    table.register(new_token(), "172.30.0.2", 8000, owner=owner_id)
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable

from denv.server.tokens import REF_PREFIX

MIN_TOKEN_CHARS = 22  # token_urlsafe(16) is 22 characters: 128 bits
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_REF_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _key(token_or_ref: str) -> bytes:
    """The table's key of a token, or of its stored ``sha256:<hex>`` ref (tokens.ref):
    routes come back from the database as refs. Only register and unregister take a ref; a
    request's token is always hashed (resolve), so a copy of the database opens nothing."""
    if token_or_ref.startswith(REF_PREFIX):
        return bytes.fromhex(token_or_ref.removeprefix(REF_PREFIX))
    return _digest(token_or_ref)


class IngressTable:
    """Thread-safe map from ingress token to the (host, port) it reaches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[bytes, tuple[str, int]] = {}
        self._owners: dict[bytes, str] = {}  # the API key (owner id) of each route
        # Who holds idle upstream connections (the proxy's pools): told to close those to a
        # host before its env's sandbox is saved (``close_idle``).
        self._holders: list[Callable[[str], None]] = []

    def register(self, token: str, host: str, port: int, owner: str = "") -> None:
        """Route ``/ingress/<token>`` to ``host:port`` (replacing any earlier target); the
        token may be given as its stored ref (``sha256:<hex>``)."""
        is_ref = bool(_REF_RE.match(token))
        if not is_ref and (len(token) < MIN_TOKEN_CHARS or not _TOKEN_RE.match(token)):
            raise ValueError(
                "an ingress token must be URL-safe base64 of at least 128 bits: "
                "make one with denv.server.ingress.proxy.new_token()"
            )
        if not 0 < port < 65536:
            raise ValueError(f"ingress port {port} is out of range: give the container's port")
        key = _key(token)
        with self._lock:
            self._targets[key] = (host, port)
            self._owners[key] = owner

    def unregister(self, token: str) -> None:
        """Forget a token (or its ref); an unknown one is ignored (delete is idempotent)."""
        with self._lock:
            self._targets.pop(_key(token), None)
            self._owners.pop(_key(token), None)

    def resolve(self, token: str) -> tuple[str, int] | None:
        """The (host, port) a token reaches, or None."""
        with self._lock:
            return self._targets.get(_digest(token))

    def owner(self, token: str) -> str:
        """The API key (owner id) whose env a token reaches; "" when unknown."""
        with self._lock:
            return self._owners.get(_digest(token), "")

    def holds_connections(self, close_idle: Callable[[str], None]) -> None:
        """``close_idle(host)`` closes the idle upstream connections its holder keeps."""
        with self._lock:
            self._holders.append(close_idle)

    def close_idle(self, host: str) -> None:
        """Close every idle pooled connection to ``host`` (an env's address): a sandbox
        with an open connection cannot be saved (``CheckpointCalls``). Blocks briefly."""
        with self._lock:
            holders = list(self._holders)
        for close in holders:
            close(host)

    def __len__(self) -> int:
        with self._lock:
            return len(self._targets)
