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

from denv.errors import EnvReadyTimeout, EnvStartError, WarmPoolStalled, WarmPoolTimeout

from ._clients import fork_client, fork_client_async, fork_clients, fork_clients_async
from ._provider import DenvProvider
from ._version import from_denv_version, install

install()

# The forkable-state helper (.state) is for the env's server side; it is imported on first
# use, so a client that never touches it does not load it.
_STATE_NAMES = ("ForkableState", "forkable", "restore_state", "save_state")

__all__ = [
    "DenvProvider",
    "EnvReadyTimeout",
    "EnvStartError",
    "ForkableState",
    "WarmPoolStalled",
    "WarmPoolTimeout",
    "fork_client",
    "fork_client_async",
    "fork_clients",
    "fork_clients_async",
    "forkable",
    "from_denv_version",
    "restore_state",
    "save_state",
]


def __getattr__(name: str) -> Any:
    if name in _STATE_NAMES:
        from . import state

        return getattr(state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
