"""Ray's token authentication for a denv cluster (Ray >= 2.52): who may join it or call it.

With ``RAY_AUTH_MODE=token`` every Ray process (GCS, raylets, workers such as the node
agents, drivers such as ``denv serve --cluster``) sends the cluster's token on each gRPC and
HTTP call and refuses calls that lack it. Ray reads the token from ``RAY_AUTH_TOKEN``, else
from the file ``RAY_AUTH_TOKEN_PATH`` names; denv uses the file (0600), so the token never
sits in a process's environment or command line.

    path = create_token_file(cluster_dir / "ray-token")   # 64 hex digits, mode 0600
    spawn([... "ray", "start" ...], log, process_env(path)) # a Ray node or a driver
    use_token(path)                                         # this process, before ray.init
    forget_token()                                          # after ray.shutdown()
    relay_key()                                             # the node relays' key (relay)

Ray reads ``RAY_AUTH_MODE`` when it is imported; ``use_token`` makes an already imported Ray
read it again, as Ray's own ``ray.init`` does when it turns token mode on.

Where the token file has the cluster's TLS files beside it (``ray_tls.TLS_DIR``, which
``denv cluster up`` makes), ``process_env`` and ``use_token`` turn Ray's TLS on with them too:
the token then never crosses the wire in clear.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from denv.cluster import ray_tls

MODE_VAR = "RAY_AUTH_MODE"
PATH_VAR = "RAY_AUTH_TOKEN_PATH"
TOKEN_VAR = "RAY_AUTH_TOKEN"  # takes precedence over the file: never inherited
TOKEN_FILE = "ray-token"
_AUTH_VARS = (MODE_VAR, PATH_VAR, TOKEN_VAR, *ray_tls.TLS_VARS)
RELAY_KEY_LABEL = b"denv ingress relay key v1"  # the relay key is HMAC(token, label)

# This process's auth variables before use_token changed them (restored by forget_token).
_saved: dict[str, str | None] | None = None


class TokenFileError(Exception):
    """The token file is missing, empty or readable by others; the message says the fix."""


def create_token_file(path: Path) -> Path:
    """A new random token (256 bits, as ``ray get-auth-token --generate`` makes) in ``path``,
    mode 0600 from the moment it exists."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    return path


def check_token_file(path: Path) -> Path:
    """``path`` if it holds a token that not every user can read; TokenFileError otherwise."""
    try:
        st = path.stat()
        token = path.read_text().strip()
    except OSError as exc:
        raise TokenFileError(
            f"Ray token file {path}: {exc.strerror}: write one with "
            f"`python -c 'import secrets; print(secrets.token_hex(32))' > {path}; "
            f"chmod 600 {path}`"
        ) from exc
    # Group bits are let be: a Kubernetes Secret's file is group-readable under fsGroup.
    if st.st_mode & stat.S_IRWXO:
        raise TokenFileError(
            f"Ray token file {path} is readable by every user (mode "
            f"{stat.S_IMODE(st.st_mode):o}): chmod 600 {path}"
        )
    if not token:
        raise TokenFileError(f"Ray token file {path} is empty: write the cluster's token in it")
    return path


def process_env(path: Path) -> dict[str, str]:
    """The variables a Ray process (node or driver) started with them joins with the token
    in ``path`` (and over TLS with the cluster's files beside it, when there are some); the
    caller drops an inherited ``RAY_AUTH_TOKEN`` (``inherited_env``)."""
    return {
        MODE_VAR: "token",
        PATH_VAR: str(path),
        **ray_tls.tls_env(path.parent / ray_tls.TLS_DIR),
    }


def inherited_env() -> dict[str, str]:
    """This process's environment less ``RAY_AUTH_TOKEN``, which would override the file."""
    return {k: v for k, v in os.environ.items() if k != TOKEN_VAR}


def use_token(path: Path) -> None:
    """Make this process join Ray clusters with the token in ``path`` (call before
    ``ray.init``); ``forget_token`` undoes it."""
    global _saved
    if _saved is None:
        _saved = {var: os.environ.get(var) for var in _AUTH_VARS}
    os.environ.pop(TOKEN_VAR, None)
    for var in ray_tls.TLS_VARS:  # none inherited: only the cluster's own files, if any
        os.environ.pop(var, None)
    os.environ.update(process_env(path))
    _reload()


def forget_token() -> None:
    """Undo ``use_token``: this process's Ray auth variables as they were (after
    ``ray.shutdown()``)."""
    global _saved
    if _saved is None:
        return
    for var, value in _saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    _saved = None
    _reload()


def cluster_token() -> str | None:
    """The token this process joins its Ray cluster with (``RAY_AUTH_TOKEN``, else the file
    of ``RAY_AUTH_TOKEN_PATH``), or None when Ray runs without token authentication."""
    if os.environ.get(MODE_VAR, "").lower() != "token":
        return None
    token = os.environ.get(TOKEN_VAR, "").strip()
    path = os.environ.get(PATH_VAR)
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError:
            return None
    return token or None


def relay_key(token: str | None = None) -> bytes | None:
    """The key that proves the control plane and the node relays to each other
    (``denv.server.ingress.relay``): derived from the cluster's Ray token (this process's
    when not given), which every machine of the cluster already holds in a 0600 file, so
    it needs no file of its own. None without a token: then there are no relays."""
    token = token if token is not None else cluster_token()
    if not token:
        return None
    return hmac.new(token.encode(), RELAY_KEY_LABEL, hashlib.sha256).digest()


def _reload() -> None:
    """Have an imported Ray read the auth variables again: its config caches the mode and
    its token loader the token (what ``ray.init`` itself does when it enables token mode)."""
    raylet: Any = importlib.import_module("ray._raylet")  # compiled: no type stubs
    raylet.Config.initialize("")
    raylet.AuthenticationTokenLoader.instance().reset_cache()
