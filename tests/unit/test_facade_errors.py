"""Every error response becomes the DenvError subclass a caller recovers from.

`error_from_response` is tested directly on response bytes (it is a pure function). The
end-to-end tests through `Denv` use httpx.MockTransport only for answers the real local server
cannot give on demand: 5xx, 429 with Retry-After, and bodies from something that is not a denv
server (a proxy's HTML, a framework's JSON). 401/404/409/422 from the real server are replayed
from cassettes in test_facade_cassettes.py.
"""

from __future__ import annotations

import json

import httpx
import pytest
from facade_fakes import ENV_ID, REQUEST_ID, Script, env_json, error_response, mock_denv

from denv import (
    APIStatusError,
    Conflict,
    DenvError,
    InvalidRequest,
    NotFound,
    RateLimited,
    ServerError,
    Unauthorized,
)
from denv import errors as errors_module
from denv.client._errors import error_from_response

URL = "http://denv.test/v1/envs/" + ENV_ID


def _error(status: int, content: bytes, **headers: str) -> APIStatusError:
    return error_from_response(status, headers, content, method="GET", url=URL)


def _denv_body(code: str, message: str) -> bytes:
    return json.dumps({"code": code, "message": message, "request_id": REQUEST_ID}).encode()


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "invalid_request", InvalidRequest),
        (401, "unauthorized", Unauthorized),
        (404, "not_found", NotFound),
        (409, "version_in_use", Conflict),
        (409, "idempotency_conflict", Conflict),
        (422, "image_not_found", InvalidRequest),
        (422, "limit_exceeded", InvalidRequest),
        (429, "quota_exceeded", RateLimited),
        (500, "internal", ServerError),
        (503, "engine_unavailable", ServerError),
    ],
)
def test_documented_statuses_map_to_their_class(status: int, code: str, cls: type) -> None:
    exc = _error(status, _denv_body(code, "what went wrong: what to do"))
    assert type(exc) is cls
    assert isinstance(exc, APIStatusError) and isinstance(exc, DenvError)
    assert (exc.status, exc.code, exc.request_id) == (status, code, REQUEST_ID)
    assert exc.message == "what went wrong: what to do"
    assert isinstance(exc.body, dict) and exc.body["code"] == code
    assert str(exc) == f"[{status} {code}] what went wrong: what to do (request_id={REQUEST_ID})"


def test_details_are_kept() -> None:
    body = {
        "code": "invalid_compose",
        "message": "services.db.image: required",
        "request_id": REQUEST_ID,
        "details": {"path": "services.db.image"},
    }
    exc = _error(422, json.dumps(body).encode())
    assert exc.details == {"path": "services.db.image"}


def test_a_code_newer_than_this_client_still_maps_by_status() -> None:
    exc = _error(409, _denv_body("some_future_code", "newer server"))
    assert type(exc) is Conflict and exc.code == "some_future_code"


def test_proxy_html_502_is_a_server_error_that_says_where_it_came_from() -> None:
    html = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
    exc = _error(502, html, **{"content-type": "text/html"})
    assert type(exc) is ServerError
    assert exc.status == 502 and exc.code is None and exc.request_id is None
    assert exc.body == html.decode()
    assert "HTTP 502 Bad Gateway without a denv error body" in exc.message
    assert "502 Bad Gateway nginx" in exc.message  # the body, whitespace collapsed


@pytest.mark.parametrize(
    ("status", "content", "cls"),
    [
        (404, b'{"detail": "Not Found"}', NotFound),  # a framework's 404 at a wrong URL
        (401, b"", Unauthorized),  # an auth proxy with no body
        (503, b"upstream connect error", ServerError),
        (418, b"teapot", APIStatusError),  # not in the contract: the base class
        (599, b"", ServerError),  # not even in http.HTTPStatus
    ],
)
def test_bodies_that_are_not_denv_errors_still_map_by_status(
    status: int, content: bytes, cls: type
) -> None:
    exc = _error(status, content)
    assert type(exc) is cls
    assert exc.status == status and exc.code is None
    assert "without a denv error body" in exc.message


def test_request_id_header_is_used_when_the_body_has_none() -> None:
    exc = _error(502, b"bad gateway", **{"x-request-id": "req_fromheader"})
    assert exc.request_id == "req_fromheader"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("7", 7.0), ("0.5", 0.5), ("-3", 0.0), ("soon", None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)],
)
def test_rate_limited_carries_retry_after(value: str, expected: float | None) -> None:
    exc = _error(429, _denv_body("rate_limited", "slow down"), **{"retry-after": value})
    assert isinstance(exc, RateLimited) and exc.retry_after_s == expected


def test_errors_module_is_the_same_hierarchy() -> None:
    assert errors_module.NotFound is NotFound
    assert issubclass(errors_module.Timeout, errors_module.TransportError)


# -- through Denv: a fake server, because the real one cannot answer these on demand


def test_server_error_through_the_facade() -> None:
    script = Script(error_response(503, "engine_unavailable", "start dockerd, then retry"))
    with mock_denv(script, max_retries=0) as denv, pytest.raises(ServerError) as info:
        denv.get_env(ENV_ID)
    assert info.value.code == "engine_unavailable"
    assert info.value.request_id == REQUEST_ID


def test_documented_status_with_an_html_body_does_not_crash_the_generated_parser() -> None:
    # 503 is documented for create_sandbox, so the generated code would call .json() on it.
    html = httpx.Response(
        503, text="<h1>Service Unavailable</h1>", headers={"content-type": "text/html"}
    )
    with mock_denv(Script(html), max_retries=0) as denv, pytest.raises(ServerError) as info:
        denv.create_sandbox("denv-echo-env:latest")
    assert "Service Unavailable" in info.value.message


def test_a_2xx_body_that_is_not_json_is_a_clear_error() -> None:
    page = httpx.Response(200, text="<html>login</html>", headers={"content-type": "text/html"})
    with mock_denv(Script(page)) as denv, pytest.raises(DenvError, match="not JSON"):
        denv.get_env(ENV_ID)


def test_success_is_the_parsed_model() -> None:
    with mock_denv(Script(httpx.Response(200, json=env_json()))) as denv:
        env = denv.get_env(ENV_ID)
    assert env.id == ENV_ID and env.status.value == "healthy"


def test_every_error_is_a_denv_error_listed_once() -> None:
    import denv.openenv

    import denv

    for name in errors_module.__all__:
        cls = getattr(errors_module, name)
        assert issubclass(cls, DenvError), name
        assert getattr(denv, name) is cls, name
    # The adapter's errors are the same classes, and keep OpenEnv's provider contract.
    assert denv.openenv.EnvStartError is errors_module.EnvStartError
    assert issubclass(errors_module.EnvStartError, RuntimeError)
    assert issubclass(errors_module.EnvReadyTimeout, TimeoutError)
    assert issubclass(errors_module.WarmPoolStalled, RuntimeError)
    assert issubclass(errors_module.WarmPoolTimeout, TimeoutError)
    assert issubclass(errors_module.LocalServerError, RuntimeError)
    error = errors_module.EnvReadyTimeout("not ready", env_id="env_1", log_tail=["boot"])
    assert error.env_id == "env_1" and error.log_tail == ("boot",) and "| boot" in str(error)
