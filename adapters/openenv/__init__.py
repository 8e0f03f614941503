"""The OpenEnv adapter: DenvProvider, fork, from_denv_version.

    from openenv.core import GenericEnvClient
    from denv.openenv import DenvProvider, fork_clients

    image = "denv-echo-env:latest"
    root = GenericEnvClient.from_docker_image(image, provider=DenvProvider()).sync()
    root.reset()
    branches = fork_clients(root, 4)     # 4 clients on 4 children of one snapshot

Importing this package adds `from_denv_version` (and, where OpenEnv lacks it, a
read-only `provider` property) to OpenEnv's `EnvClient` and `SyncEnvClient`.
"""

from __future__ import annotations

from typing import Any

from ._clients import fork_client, fork_clients
from ._errors import EnvReadyTimeout, EnvStartError
from ._provider import DenvProvider
from ._version import from_denv_version, install

install()

__all__ = [
    "DenvProvider",
    "EnvReadyTimeout",
    "EnvStartError",
    "fork_client",
    "fork_clients",
    "from_denv_version",
]


def __getattr__(name: str) -> Any:
    # The forkable-state helper lives in .state (written separately); import it on
    # first use so this package works without it.
    if name.startswith("_"):
        raise AttributeError(name)
    try:
        from . import state
    except ImportError as exc:
        raise AttributeError(f"module 'denv.openenv' has no attribute {name!r}") from exc
    try:
        return getattr(state, name)
    except AttributeError:
        raise AttributeError(f"module 'denv.openenv' has no attribute {name!r}") from None
