"""One mapping from exceptions to the contract's ``Error`` body.

Every error response, including FastAPI's own validation errors and unknown routes,
is ``{"code", "message", "request_id", "details"}`` with a stable ``code``. The API's own
refusals are ``ApiError``s, which carry their status; a node's (``node.errors.Refused``:
an invalid egress entry, a missing image, an engine that does not answer) get theirs here,
at the edge, since nothing below the node seam knows HTTP (``NODE_STATUS``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from denv.server.node.errors import (
    CheckpointUnsupported,
    ImageNotFound,
    Invalid,
    Refused,
    Unavailable,
)

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # Retry-After of a 429 for a busy key (fairness): it frees on its own
QUOTA_RETRY_AFTER_S = 30  # ... for a quota (live envs, versions, spares): freed by deletes


class ApiError(Exception):
    """An error the API reports as-is: HTTP status, machine code, human message."""

    def __init__(
        self, status: int, code: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # All its fields survive a trip to another process (pickle), subclasses included.
        return (_rebuild, (type(self), self.status, self.code, self.message, self.details))


def _rebuild(
    cls: type[ApiError], status: int, code: str, message: str, details: dict[str, Any] | None
) -> ApiError:
    err = cls.__new__(cls)
    ApiError.__init__(err, status, code, message, details)
    return err


def not_found(kind: str, ident: str) -> ApiError:
    return ApiError(404, "not_found", f"no {kind} '{ident}' for this API key")


def invalid(message: str, path: str | None = None) -> ApiError:
    return ApiError(422, "invalid_request", message, {"path": path} if path else None)


# The status of each kind of refusal a node answers; its code, message and details are the
# node's own. A kind is looked up by its class and then its bases (NoCapacity: Unavailable).
NODE_STATUS: dict[type[Refused], int] = {
    Invalid: 422,
    ImageNotFound: 422,
    Unavailable: 503,
    CheckpointUnsupported: 409,
}


def from_node(exc: Refused) -> ApiError:
    """A node's refusal as the API answers it: the status of its kind, its code, message and
    details as they are (a kind ``NODE_STATUS`` does not name is a bug here: 500)."""
    status = next((NODE_STATUS[c] for c in type(exc).__mro__ if c in NODE_STATUS), None)
    if status is None:
        return ApiError(500, "internal", f"{type(exc).__name__}: {exc.message}")
    return ApiError(status, exc.code, exc.message, exc.details)


def retry_after_s(exc: ApiError) -> int:
    """Seconds a 429's ``Retry-After`` asks for: its ``details``, else by its kind."""
    given = (exc.details or {}).get("retry_after_s")
    if isinstance(given, int):
        return given
    return QUOTA_RETRY_AFTER_S if exc.code == "quota_exceeded" else RETRY_AFTER_S


def request_id(request: Request) -> str:
    rid = getattr(request.state, "request_id", None)
    return rid if isinstance(rid, str) else "req_unknown"


def error_response(
    request: Request, status: int, code: str, message: str, details: dict[str, Any] | None = None
) -> JSONResponse:
    body = {"code": code, "message": message, "request_id": request_id(request), "details": details}
    return JSONResponse(body, status_code=status)


def _location(loc: Any) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


# What a value of each id or name pattern of the contract is, in the user's words.
_PATTERN_WORDS = {
    "^env_": "an env id (env_ and 26 letters and digits, as `denv envs` lists them)",
    "^ver_": "a version id (ver_ and 26 letters and digits, as `denv versions` lists them)",
    "^[a-z0-9][a-z0-9-]": "a project name (lower-case letters, digits and dashes)",
    "^[a-zA-Z0-9][a-zA-Z0-9_.-]": "a service name (letters, digits, '_', '.' and '-')",
}


def _problem(error: Any) -> str:
    """One validation error as "field: what is wrong", the field named as the request has it
    (a query parameter by its name, a body field by its path), without pydantic's regex."""
    where = _location(error.get("loc", ()))
    if where.startswith(("query.", "path.", "header.")):
        where = where.split(".", 1)[1]
    msg = str(error.get("msg", "invalid"))
    if error.get("type") == "string_pattern_mismatch":
        pattern = str((error.get("ctx") or {}).get("pattern", ""))
        words = next((w for p, w in _PATTERN_WORDS.items() if pattern.startswith(p)), None)
        if words is not None:
            given = str(error.get("input"))
            shown = given if len(given) <= 80 else given[:77] + "..."
            return f"{where}: {shown!r} is not {words}"
    return f"{where}: {msg}"


def _allowed(request: Request) -> list[str]:
    """The methods of every route matching this path (Starlette names only the first's)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches(request.scope)
            if match != Match.NONE:
                methods |= route.methods
    methods.discard("HEAD")  # served for GET, but not a documented operation
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every failure into an ``Error`` body."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        res = error_response(request, exc.status, exc.code, exc.message, exc.details)
        if exc.status == 429:  # every cap says when to come back (fairness)
            res.headers["Retry-After"] = str(retry_after_s(exc))
        return res

    @app.exception_handler(Refused)
    async def _node_refused(request: Request, exc: Refused) -> JSONResponse:
        return await _api_error(request, from_node(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        where = _location(first.get("loc", ()))
        message = _problem(first)
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem(s))"
        return error_response(request, 422, "invalid_request", message, {"path": where})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return error_response(
                request, 404, "not_found", f"no route {request.method} {request.url.path}"
            )
        if exc.status_code == 405:
            res = error_response(
                request, 405, "invalid_request", f"method {request.method} not allowed here"
            )
            res.headers["Allow"] = ", ".join(_allowed(request))
            return res
        if exc.status_code == 400:  # e.g. a body that is not JSON: the contract says 422
            return error_response(request, 422, "invalid_request", f"body: {exc.detail}")
        code = "invalid_request" if 400 <= exc.status_code < 500 else "internal"
        return error_response(request, exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return error_response(
            request, 500, "internal", "internal server error: see server.log for this request_id"
        )
