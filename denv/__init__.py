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
)

from ._client import Denv
from ._errors import (
    APIStatusError,
    Conflict,
    ConnectionFailed,
    DenvConfigError,
    DenvError,
    InvalidRequest,
    NotFound,
    RateLimited,
    ServerError,
    Timeout,
    TransportError,
    Unauthorized,
)

__all__ = [
    "APIStatusError",
    "Conflict",
    "ConnectionFailed",
    "Denv",
    "DenvConfigError",
    "DenvError",
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
    "InvalidRequest",
    "NotFound",
    "Project",
    "RateLimited",
    "ServerError",
    "StartMode",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Version",
    "VersionService",
    "WaitFor",
]
