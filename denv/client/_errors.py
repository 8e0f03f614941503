"""Turning an error response into the matching `denv.errors` class (and reading Retry-After),
and a failed connection into a `ConnectionFailed` that says why in a few words.

A denv server answers errors with the contract's Error JSON; anything else still maps by status.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from .errors import (
    APIStatusError,
    Conflict,
    ConnectionFailed,
    InsufficientStorage,
    InvalidRequest,
    LeaseExpired,
    NotFound,
    RateLimited,
    ServerError,
    Unauthorized,
)

__all__ = ["cannot_reach", "error_from_response", "parse_retry_after"]

_TAG = re.compile(r"<[^>]*>")
# How much of a body that is not a denv error is quoted in the message.
_BODY_EXCERPT_CHARS = 200

# What an OS or TLS error says, in the few words a person reads: (fragment, words).
_CONNECT_REASONS = (
    ("refused", "connection refused"),
    ("name or service not known", "host name not found"),
    ("nodename nor servname", "host name not found"),
    ("name resolution", "host name not found"),
    ("no route to host", "no route to host"),
    ("network is unreachable", "network unreachable"),
    ("timed out", "no answer to connect"),
    ("certificate_verify_failed", "its TLS certificate is not trusted"),
)

_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    422: InvalidRequest,
    429: RateLimited,
    507: InsufficientStorage,
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
        if cls is Conflict and isinstance(details, dict) and "lease_id" in details:
            cls = LeaseExpired  # a create under, or a renewal of, a lease that has ended
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


def _connect_reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    lowered = text.lower()
    if "timeout" in type(exc).__name__.lower():
        return "no answer to connect"
    return next((words for fragment, words in _CONNECT_REASONS if fragment in lowered), text)


def cannot_reach(server: str, exc: BaseException, *, method: str, url: str) -> ConnectionFailed:
    """The `ConnectionFailed` for a connection to `server` that could not be made, e.g.
    "cannot reach the denv server at http://127.0.0.1:7711 (connection refused): is it
    running? `denv serve`"."""
    reason = _connect_reason(exc)
    if reason == "its TLS certificate is not trusted":
        advice = (
            "give the CA that signed it with DENV_CA_BUNDLE (a PEM file) or Denv(ca_bundle=...)"
        )
    else:
        advice = "is it running? `denv serve`"
    return ConnectionFailed(
        f"cannot reach the denv server at {server} ({reason}): {advice}", method=method, url=url
    )
