"""API keys: ``dak_`` + 43 URL-safe characters; only their sha256 digests are stored.

Create an extra key (tests, a second user) with :func:`create_api_key`; a running server
accepts it at once, because a digest it does not know is looked up in the database.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from pathlib import Path

from fastapi import Request

from .errors import ApiError
from .store import Store


def new_key() -> str:
    return "dak_" + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def load_or_create_key_file(state_dir: Path) -> tuple[str, Path]:
    """The key in ``<state_dir>/api_key``, made (mode 0600) when absent."""
    path = state_dir / "api_key"
    if path.exists():
        key = path.read_text().strip()
        if key:
            return key, path
    state_dir.mkdir(parents=True, exist_ok=True)
    key = new_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key, path


def create_api_key(state_dir: Path) -> str:
    """Add a new API key to the server of ``state_dir`` and return it (running or not).

    Example: ``key2 = create_api_key(Path(state_dir))`` gives a second caller that sees none
    of the first key's envs or versions.
    """
    store = Store(state_dir / "denv.db")
    try:
        key = new_key()
        store.add_key_digest(digest(key))
        return key
    finally:
        store.close()


class KeyRing:
    """Checks bearer keys in constant time against the stored digests."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._digests: list[str] = store.key_digests()

    def _match(self, presented: str) -> bool:
        with self._lock:
            known = list(self._digests)
        found = False
        for d in known:
            found |= hmac.compare_digest(presented, d)
        return found

    def owner_of(self, key: str) -> str | None:
        """The owner id (the key's digest) or None when the key is not known."""
        d = digest(key)
        if self._match(d):
            return d
        fresh = self._store.key_digests()  # a key added while the server runs
        with self._lock:
            self._digests = fresh
        return d if self._match(d) else None


def owner_from_request(request: Request) -> str:
    """The caller's owner id from ``Authorization: Bearer dak_...``, or 401."""
    ring: KeyRing = request.app.state.keyring
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(
            401,
            "unauthorized",
            "missing API key: send 'Authorization: Bearer dak_...' "
            "(denv serve prints where its key file is)",
        )
    owner = ring.owner_of(key.strip())
    if owner is None:
        raise ApiError(
            401,
            "unauthorized",
            "API key not known to this server: use the key in its state directory "
            "(<state_dir>/api_key) or one made with create_api_key",
        )
    return owner
