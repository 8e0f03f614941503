"""Ingress tokens derived from a server secret: the database holds only their digests.

An env's ingress URL (``<server>/ingress/<token>``) is its capability. The token of an env's
port is an HMAC of the env id, service and port under the server's ingress secret (32
random bytes in ``<state_dir>/ingress_key``, mode 0600, never in the database), so nothing
has to store it: the routes are kept as ``sha256:<hex>`` digests (``ref``), the env's
runtime keeps no token, and the idempotency record of a create keeps its body without
tokens (``scrub_body``), filled in again on a replay (``fill_body``). ``GET /v1/envs/{id}``
renders the same URL every time. A copy of the database alone opens no env; deleting
``ingress_key`` while envs live changes the URLs the API shows for them (their old URLs
keep routing until the envs are deleted).

    keys = IngressKeys.load_or_create(state_dir)
    token = keys.token("env_01...", "agent", 8000)   # the same token every time
    ref(token)                                       # "sha256:...": what the store keeps
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Any

KEY_FILE = "ingress_key"
TOKEN_BYTES = 24  # 192 bits: 32 URL-safe characters, as new_token() makes
REF_PREFIX = "sha256:"  # ':' is never in a token, so a ref cannot be presented as one
_INGRESS = "/ingress/"


def ref(token: str) -> str:
    """What is stored for ``token``: ``sha256:<hex>`` (a ref is returned unchanged)."""
    if token.startswith(REF_PREFIX):
        return token
    return REF_PREFIX + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class IngressKeys:
    """The server's ingress secret, and the tokens it derives."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 32:
            raise ValueError("an ingress secret needs at least 32 bytes")
        self._secret = secret

    @classmethod
    def ephemeral(cls) -> IngressKeys:
        """A secret that lives as long as the process (for servers without a state dir)."""
        return cls(secrets.token_bytes(32))

    @classmethod
    def load_or_create(cls, state_dir: Path) -> IngressKeys:
        """The secret in ``<state_dir>/ingress_key`` (hex), made (mode 0600) when absent."""
        path = state_dir / KEY_FILE
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text:
            path.chmod(0o600)
            return cls(bytes.fromhex(text))
        secret = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret.hex() + "\n")
        return cls(secret)

    def token(self, env_id: str, service: str, port: int) -> str:
        """The ingress token of an env's port: URL-safe base64 of 192 bits."""
        msg = f"denv-ingress\0{env_id}\0{service}\0{port}".encode()
        mac = hmac.new(self._secret, msg, hashlib.sha256).digest()[:TOKEN_BYTES]
        return base64.urlsafe_b64encode(mac).decode()


def _env_objects(obj: Any) -> list[dict[str, Any]]:
    """Every Env object in a response body (an Env, a fork result, a batch, a list)."""
    found: list[dict[str, Any]] = []
    if isinstance(obj, dict):
        if isinstance(obj.get("id"), str) and isinstance(obj.get("endpoints"), list):
            found.append(obj)
        for value in obj.values():
            found += _env_objects(value)
    elif isinstance(obj, list):
        for value in obj:
            found += _env_objects(value)
    return found


def scrub_body(obj: Any) -> Any:
    """``obj`` (a JSON body) with the token cut from every ingress URL, in place."""
    for env in _env_objects(obj):
        for e in env["endpoints"]:
            if isinstance(e, dict) and e.get("via") == "ingress" and _INGRESS in str(e["url"]):
                e["url"] = str(e["url"]).rsplit(_INGRESS, 1)[0] + _INGRESS
    return obj


def fill_body(obj: Any, keys: IngressKeys) -> Any:
    """The inverse of :func:`scrub_body`: each ingress URL gets its env's token again."""
    for env in _env_objects(obj):
        for e in env["endpoints"]:
            url = str(e.get("url", "")) if isinstance(e, dict) else ""
            if e.get("via") == "ingress" and url.endswith(_INGRESS):
                e["url"] = url + keys.token(env["id"], str(e["service"]), int(e["port"]))
    return obj
