"""denv: run RL environments as sandboxes and fork their live state.

    from denv import Denv

    with Denv() as denv:  # DENV_SERVER / DENV_API_KEY, else the local `denv serve`
        env = denv.create_sandbox("denv-echo-env:latest")
        fork = denv.fork(env.id, count=4)

Errors are `denv.DenvError` subclasses (also importable from `denv.errors`); models are the
generated ones from `openapi/denv.yaml`, re-exported here.
"""

from denv_api_client.models import (
    Egress,
    Endpoint,
    EndpointVia,
    Env,
    EnvError,
    EnvErrorCode,
    EnvService,
    EnvServiceStatus,
    EnvStatus,
    ErrorCode,
    Fork,
    Health,
    Project,
    StartMode,
    Version,
    VersionService,
    WaitFor,
    WarmPool,
    WarmPoolState,
)

from . import errors
from ._client import Denv
from .errors import *  # noqa: F403  (the error classes; one list, in denv.errors)

__all__ = [
    "Denv",
    "Egress",
    "Endpoint",
    "EndpointVia",
    "Env",
    "EnvError",
    "EnvErrorCode",
    "EnvService",
    "EnvServiceStatus",
    "EnvStatus",
    "ErrorCode",
    "Fork",
    "Health",
    "Project",
    "StartMode",
    "Version",
    "VersionService",
    "WaitFor",
    "WarmPool",
    "WarmPoolState",
]
__all__ += errors.__all__
