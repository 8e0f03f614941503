"""The errors of the denv client and its OpenEnv adapter: the one list, shaped by how a caller
recovers. `except denv.DenvError` catches every one of them.

    DenvError
    ├── APIStatusError          the server said no (status, code, message, request_id, body)
    │   ├── InvalidRequest      400/422: fix the request
    │   ├── Unauthorized        401: fix the API key
    │   ├── NotFound            404: no such env/version for this key
    │   ├── Conflict            409: the resource's state forbids it (e.g. version_in_use)
    │   ├── RateLimited         429: slow down (retry_after_s)
    │   └── ServerError         5xx: the server or its engine failed
    ├── TransportError          no answer came back
    │   ├── ConnectionFailed    could not connect, or the connection broke
    │   └── Timeout             no answer within the call's timeout
    ├── DenvConfigError         the client does not know where its server is, or with what key
    ├── LocalServerError        the local server did not start or stop (also a RuntimeError)
    ├── EnvStartError           an env failed while starting (also a RuntimeError)
    ├── EnvReadyTimeout         an env was not ready in time (also a TimeoutError)
    ├── WarmPoolStalled         an env's spares stopped booting (also a RuntimeError)
    └── WarmPoolTimeout         an env's spares were not booted in time (also a TimeoutError)

The last four are raised by the OpenEnv adapter (`denv.openenv`); OpenEnv's provider contract
wants a failed start to be a `RuntimeError` and a readiness wait that runs out a
`TimeoutError`, so they are those as well.

No message, repr or attribute of these errors ever holds an API key: everything that came
from outside is passed through `redact` first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ._config import API_KEY_PREFIX

__all__ = [
    "APIStatusError",
    "Conflict",
    "ConnectionFailed",
    "DenvConfigError",
    "DenvError",
    "EnvReadyTimeout",
    "EnvStartError",
    "InsufficientStorage",
    "InvalidRequest",
    "LeaseExpired",
    "LocalServerError",
    "NotFound",
    "RateLimited",
    "ServerError",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "WarmPoolStalled",
    "WarmPoolTimeout",
]

_KEY_PATTERN = re.compile(re.escape(API_KEY_PREFIX) + r"[A-Za-z0-9_\-]+")
_REDACTED = API_KEY_PREFIX + "***"


def redact(text: str) -> str:
    """`text` with every API key (`dak_...`) replaced by `dak_***`."""
    return _KEY_PATTERN.sub(_REDACTED, text)


def _redact_any(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(str(k)): _redact_any(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_any(v) for v in value]
    return value


class DenvError(Exception):
    """Base class of every error the denv client raises."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        request_id: str | None = None,
    ) -> None:
        self.message = redact(message)
        self.status = status
        self.code = code
        self.request_id = request_id
        super().__init__(self.message)

    def __str__(self) -> str:
        head = " ".join(str(p) for p in (self.status, self.code) if p is not None)
        text = f"[{head}] {self.message}" if head else self.message
        return f"{text} (request_id={self.request_id})" if self.request_id else text

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, "
            f"message={self.message!r}, request_id={self.request_id!r})"
        )


class APIStatusError(DenvError):
    """The server answered with an error status. `body` is the parsed JSON, or the text."""

    status: int

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str | None = None,
        request_id: str | None = None,
        body: object = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, status=status, code=code, request_id=request_id)
        self.body: object = _redact_any(body)
        self.details: dict[str, Any] | None = _redact_any(dict(details)) if details else None


class InvalidRequest(APIStatusError):
    """400/422: the request is invalid (`invalid_request`, `image_not_found`, `limit_exceeded`)."""


class Unauthorized(APIStatusError):
    """401: the API key is missing or not known to this server."""


class NotFound(APIStatusError):
    """404: no such resource for this API key."""


class Conflict(APIStatusError):
    """409: the resource's state forbids this (`version_in_use`, `idempotency_conflict`...)."""


class LeaseExpired(Conflict):
    """409: the client's lease ended (`details`: `lease_id`, `state`), so the server deleted
    the envs it held: the client was paused or cut off from the server for longer than the
    lease's timeout (or it was closed). Envs made from now on need a new client; detach envs
    (`Denv.detach`, `Denv(detach=True)`) that must outlive their client."""

    @property
    def lease_id(self) -> str | None:
        return None if self.details is None else self.details.get("lease_id")


class RateLimited(APIStatusError):
    """429: too many requests or envs; `retry_after_s` says when to try again, if known."""

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class InsufficientStorage(APIStatusError):
    """507: the request would add disk past a budget: this key's disk quota
    (`disk_quota_exceeded`: delete envs and versions, or `Denv.gc()` for expired ones) or the
    server's floor of free disk (`disk_low`). Running envs are not touched; retrying helps
    only once disk is freed."""


class ServerError(APIStatusError):
    """5xx: the server, a proxy in front of it, or its container engine failed."""


class TransportError(DenvError):
    """No answer came back from the server."""

    def __init__(self, message: str, *, method: str, url: str) -> None:
        super().__init__(message)
        self.method = method
        self.url = redact(url)


class ConnectionFailed(TransportError):
    """The client could not connect to the server, or the connection broke mid-call."""


class Timeout(TransportError):
    """The server did not answer within the call's timeout."""

    def __init__(self, message: str, *, method: str, url: str, timeout_s: float | None) -> None:
        super().__init__(message, method=method, url=url)
        self.timeout_s = timeout_s


class DenvConfigError(DenvError):
    """The client lacks configuration (server URL, API key) or an installed extra."""


class LocalServerError(DenvError, RuntimeError):
    """The local server (`denv serve`) did not start, or did not stop, in time."""


def _describe(summary: str, env_id: str | None, log_tail: Sequence[str], fix: str) -> str:
    parts = [summary]
    if log_tail:
        parts.append("Last log lines:\n" + "\n".join(f"  | {line}" for line in log_tail))
    elif env_id is not None:
        parts.append("The env wrote no log lines.")
    if fix:
        parts.append(fix)
    return "\n".join(parts)


class _EnvDetails(DenvError):
    """The env an error is about (`env_id`), and what it printed last (`log_tail`)."""

    def __init__(
        self,
        summary: str,
        *,
        env_id: str | None = None,
        log_tail: Sequence[str] = (),
        fix: str = "",
    ) -> None:
        super().__init__(_describe(summary, env_id, log_tail, fix))
        self.env_id = env_id
        self.log_tail = tuple(log_tail)


class EnvStartError(_EnvDetails, RuntimeError):
    """The env failed while starting: its server exited, or the server could not start it.

    `env_id` names the env (already deleted, so nothing is left behind) and
    `log_tail` holds its last log lines.
    """


class EnvReadyTimeout(_EnvDetails, TimeoutError):
    """The env did not become ready in time; `log_tail` shows how far it got."""


class WarmPoolStalled(DenvError, RuntimeError):
    """The env's warm pool stopped filling: spare boots keep failing, or no room is left.

    `pool` is the server's last report (`denv.WarmPool`); its `error` says why.
    """

    def __init__(self, message: str, pool: object) -> None:
        super().__init__(message)
        self.pool = pool


class WarmPoolTimeout(DenvError, TimeoutError):
    """The env's warm pool was not full in time; `pool` is the server's last report."""

    def __init__(self, message: str, pool: object) -> None:
        super().__init__(message)
        self.pool = pool
