"""API keys: ``dak_`` + 43 URL-safe characters; only their sha256 digests are stored.

Create an extra key (tests, a second user) with :func:`create_api_key`; a running server
accepts it at once, because a digest it does not know is looked up in the database.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import threading
from pathlib import Path

from fastapi import Request

from denv.server.db import Store
from denv.server.errors import ApiError

log = logging.getLogger(__name__)


def bearer(header: str) -> str | None:
    """The credentials of an ``Authorization: Bearer ...`` value, whatever its case and
    spacing (``bearer  dak_x``, a tab); None for another scheme or none at all."""
    scheme, *rest = header.split(None, 1) or [""]
    key = rest[0].strip() if rest else ""
    return key if scheme.lower() == "bearer" and key else None


def holds_api_key(header: bytes) -> bool:
    """Whether an Authorization value carries a denv API key, under any scheme or spacing:
    the ingress never forwards one to an env."""
    return any(word.startswith(b"dak_") for word in header.split())


def new_key() -> str:
    return "dak_" + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def private_dir(path: Path) -> None:
    """Make ``path`` (the state dir: database, API key, volumes) readable by its owner only.

    A shared directory (sticky, such as /tmp) is left as it is, with a warning: denv's state
    dir should be a directory of its own.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_mode & 0o077 == 0:
        return
    if st.st_mode & stat.S_ISVTX or st.st_uid != os.getuid():
        log.warning(
            "state dir %s is shared (mode %o): give denv a dir of its own",
            path,
            st.st_mode & 0o7777,
        )
        return
    path.chmod(0o700)


def load_or_create_key_file(state_dir: Path) -> tuple[str, Path]:
    """The key in ``<state_dir>/api_key``, made (mode 0600) when absent."""
    path = state_dir / "api_key"
    if path.exists():
        key = path.read_text().strip()
        if key:
            path.chmod(0o600)  # made by an older denv, or copied in
            return key, path
    private_dir(state_dir)
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
    key = bearer(request.headers.get("authorization", ""))
    if key is None:
        raise ApiError(
            401,
            "unauthorized",
            "missing API key: send 'Authorization: Bearer dak_...' "
            "(denv serve prints where its key file is)",
        )
    owner = ring.owner_of(key)
    if owner is None:
        raise ApiError(
            401,
            "unauthorized",
            "API key not known to this server: use the key in its state directory "
            "(<state_dir>/api_key) or one made with create_api_key",
        )
    return owner
