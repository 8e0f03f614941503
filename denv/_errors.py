"""The errors of the denv client, shaped by how a caller recovers.

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
    └── DenvConfigError         the client does not know where its server is, or with what key

No message, repr or attribute of these errors ever holds an API key: everything that came
from outside is passed through `redact` first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from ._config import API_KEY_PREFIX

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
    "error_from_response",
    "redact",
]

_KEY_PATTERN = re.compile(re.escape(API_KEY_PREFIX) + r"[A-Za-z0-9_\-]+")
_REDACTED = API_KEY_PREFIX + "***"
_TAG = re.compile(r"<[^>]*>")
# How much of a body that is not a denv error is quoted in the message.
_BODY_EXCERPT_CHARS = 200


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


class RateLimited(APIStatusError):
    """429: too many requests or live envs; `retry_after_s` says when to try again, if known."""

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


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


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    422: InvalidRequest,
    429: RateLimited,
}


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from datetime import UTC, datetime
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown Status"


def error_from_response(
    status: int, headers: Mapping[str, str], content: bytes, *, method: str, url: str
) -> APIStatusError:
    """Turn one error response into the matching `APIStatusError` subclass.

    A denv server answers errors with the contract's Error JSON (`code`, `message`,
    `request_id`). Anything else (a proxy's HTML 502, a framework's `{"detail": ...}`, an empty
    body) still becomes the right class for its status, with a message that quotes the body and
    says it did not come from a denv server.
    """
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else APIStatusError)
    request_id = headers.get("x-request-id")
    body: object = None
    text = content.decode("utf-8", errors="replace")
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = text
    extra: dict[str, Any] = {}
    if cls is RateLimited:
        extra["retry_after_s"] = parse_retry_after(headers.get("retry-after"))
    if (
        isinstance(body, dict)
        and isinstance(body.get("code"), str)
        and isinstance(body.get("message"), str)
    ):
        details = body.get("details")
        return cls(
            body["message"],
            status=status,
            code=body["code"],
            request_id=body.get("request_id") or request_id,
            body=body,
            details=details if isinstance(details, dict) else None,
            **extra,
        )
    # Tags dropped: a proxy's HTML error page reads as its words ("502 Bad Gateway nginx").
    excerpt = " ".join(_TAG.sub(" ", text).split())[:_BODY_EXCERPT_CHARS] or "(empty body)"
    message = (
        f"{method} {url} answered HTTP {status} {_reason(status)} without a denv error body "
        f"(a proxy in front of the server, a server crash, or a DENV_SERVER that is not a "
        f"denv server?): {excerpt}"
    )
    return cls(message, status=status, request_id=request_id, body=body, **extra)
