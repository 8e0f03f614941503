"""The errors of the denv client (`from denv.errors import NotFound`); see `denv._errors`."""

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
    "DenvConfigError",
    "DenvError",
    "InvalidRequest",
    "NotFound",
    "RateLimited",
    "ServerError",
    "Timeout",
    "TransportError",
    "Unauthorized",
]
