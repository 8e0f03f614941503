"""Where a client finds its server and key.

Argument first, then DENV_SERVER / DENV_API_KEY, then the local server of the state directory
(`denv._local`, which ships with the server and may be absent in a client-only install);
otherwise a `DenvConfigError` that says what to set or start.
"""

from __future__ import annotations

import importlib
import os
from typing import Protocol

from . import _config
from ._errors import DenvConfigError

__all__ = ["resolve"]


class _LocalServer(Protocol):
    url: str
    api_key: str


def _read_local_server() -> _LocalServer | None:
    try:
        # Imported lazily: discovery of the local server is optional in a client-only install.
        local = importlib.import_module("denv._local")
    except ImportError:
        return None
    found: _LocalServer | None = local.read_local_server()
    return found


def resolve(server: str | None, api_key: str | None) -> tuple[str, str]:
    """Server URL and key: argument, then DENV_SERVER/DENV_API_KEY, then the local server."""
    server = server or os.environ.get(_config.ENV_SERVER) or None
    api_key = api_key or os.environ.get(_config.ENV_API_KEY) or None
    if server is None or api_key is None:
        local = _read_local_server()
        if local is not None:
            if server is None:
                server = local.url
            if api_key is None and server.rstrip("/") == local.url.rstrip("/"):
                api_key = local.api_key
    if server is None:
        raise DenvConfigError(
            "no denv server is configured and no local one is running: start one with "
            f"`denv serve` (needs `pip install 'denv[server]'` and Docker), or set "
            f"{_config.ENV_SERVER} and {_config.ENV_API_KEY}"
        )
    if api_key is None:
        raise DenvConfigError(
            f"no API key for the denv server at {server}: set {_config.ENV_API_KEY} or pass "
            f"api_key= (the local server keeps its key in "
            f"{_config.default_state_dir() / 'api_key'})"
        )
    return server.rstrip("/"), api_key
