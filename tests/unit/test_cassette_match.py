"""A cassette replay fails when the client sends something other than what was recorded.

Each test changes one thing in what goes over the wire (a body field, a query parameter, a
header), through the facade's API or by rewriting the request as httpx sends it, and checks
that the replay of tests/unit/cassette_match.py refuses it and names what differed. The
unchanged rewrite passes, so the failures come from the change and nothing else.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

import facade_scenarios
import httpx
import provider_scenarios
import pytest
from cassette_match import json_body, replay
from facade_scenarios import CASSETTE_KEY, CASSETTE_SERVER
from vcr.errors import CannotOverwriteExistingCassetteException
from vcr.request import Request

import denv.client._operations
import denv.client._operations_versions
from denv import Denv

Change = Callable[[httpx.Request], httpx.Request]


def _no_retry(seconds: float) -> None:
    raise AssertionError(f"the facade tried to retry (after {seconds}s) during a replay")


def run_facade(name: str) -> Any:
    with (
        replay(f"{name}.yaml"),
        Denv(CASSETTE_SERVER, CASSETTE_KEY, _sleep=_no_retry, detach=True) as denv,
    ):
        return facade_scenarios.SCENARIOS[name](denv)


def run_provider(name: str) -> Any:
    def ws_probe(base_url: str, timeout_s: float) -> str | None:
        return None

    with replay(f"provider_{name}.yaml"):
        return provider_scenarios.SCENARIOS[name](CASSETTE_SERVER, CASSETTE_KEY, ws_probe)


def change_sent(monkeypatch: pytest.MonkeyPatch, change: Change) -> None:
    """Every request any httpx.Client sends goes out as `change` makes it."""
    send = httpx.Client.send

    def send_changed(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> Any:
        return send(self, change(request), **kwargs)

    monkeypatch.setattr(httpx.Client, "send", send_changed)


def rebuilt(request: httpx.Request, **changes: Any) -> httpx.Request:
    """`request` made anew (Content-Length recomputed), with `changes` to its parts."""
    headers = httpx.Headers(request.headers)
    headers.pop("content-length", None)
    parts: dict[str, Any] = {
        "method": request.method,
        "url": request.url,
        "headers": headers,
        "content": request.content,
        "extensions": request.extensions,
    }
    return httpx.Request(**{**parts, **changes})


def edit_json(path_end: str, edit: Callable[[dict[str, Any]], None]) -> Change:
    """Change the JSON body of requests whose path ends with `path_end`."""

    def change(request: httpx.Request) -> httpx.Request:
        if not request.url.path.endswith(path_end):
            return request
        document = json.loads(request.content)
        edit(document)
        return rebuilt(request, content=json.dumps(document).encode())

    return change


def edit_headers(edit: Callable[[httpx.Headers, httpx.Request], None]) -> Change:
    def change(request: httpx.Request) -> httpx.Request:
        headers = httpx.Headers(request.headers)
        edit(headers, request)
        return rebuilt(request, headers=headers)

    return change


def refusal(caught: pytest.ExceptionInfo[CannotOverwriteExistingCassetteException]) -> str:
    """Why the closest recorded request did not match: 'matcher: message' lines."""
    return "\n".join(
        f"{name}: {message}"
        for _request, _passed, failed in caught.value.similar_requests
        for name, message in failed
    )


# -- the rewrite itself changes nothing


def test_an_unchanged_rewrite_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    change_sent(monkeypatch, edit_json("/fork", lambda document: None))
    change_sent(monkeypatch, edit_headers(lambda headers, request: None))
    run_facade("fork")
    run_provider("ready")


# -- body


def test_a_changed_body_field_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    create = Denv.create_sandbox

    def create_allowing_egress(self: Denv, image: str, **kwargs: Any) -> Any:
        return create(self, image, **{**kwargs, "egress": "allow"})

    monkeypatch.setattr(Denv, "create_sandbox", create_allowing_egress)
    with pytest.raises(CannotOverwriteExistingCassetteException) as caught:
        run_facade("create_sandbox")
    assert "json_body: body differs in ['egress']" in refusal(caught)


def test_a_dropped_body_field_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    change_sent(monkeypatch, edit_json("/fork", lambda document: document.pop("count")))
    with pytest.raises(CannotOverwriteExistingCassetteException) as caught:
        run_facade("fork")
    assert "json_body: body differs in ['count']" in refusal(caught)


def test_an_added_body_field_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    change_sent(monkeypatch, edit_json("/v1/sandboxes", lambda document: document.update(x=1)))
    with pytest.raises(CannotOverwriteExistingCassetteException) as caught:
        run_provider("start")
    assert "json_body: body differs in ['x']" in refusal(caught)


def test_a_wait_beyond_the_deadline_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    change_sent(monkeypatch, edit_json("/wait", lambda document: document.update(timeout_s=600)))
    with pytest.raises(CannotOverwriteExistingCassetteException) as caught:
        run_provider("ready")
    assert "json_body: timeout_s 600 is not in (0, 120]" in refusal(caught)


@pytest.mark.parametrize(
    ("sent", "problem"),
    [
        (119.5, None),
        (120, None),
        (120.5, "not in (0, 120]"),
        (0, "not in (0, 120]"),
        ("119", "is not a number"),
        (True, "is not a number"),
    ],
)
def test_the_remaining_wait_is_checked_for_shape(sent: object, problem: str | None) -> None:
    def wait(timeout_s: object) -> Request:
        body = json.dumps({"until": "healthy", "timeout_s": timeout_s})
        uri = "http://127.0.0.1:7711/v1/envs/env_00000000000000000000000001/wait"
        return Request("POST", uri, body, {"content-type": "application/json"})

    if problem is None:
        json_body(wait(sent), wait(119.99999468200008))
    else:
        with pytest.raises(AssertionError, match=re.escape(problem)):
            json_body(wait(sent), wait(119.99999468200008))


# -- query


def test_a_dropped_query_parameter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def drop_tail(request: httpx.Request) -> httpx.Request:
        return rebuilt(request, url=request.url.copy_remove_param("tail"))

    change_sent(monkeypatch, drop_tail)
    with pytest.raises(CannotOverwriteExistingCassetteException) as caught:
        run_facade("logs")
    assert "query: " in refusal(caught) and "tail" in refusal(caught)


def test_a_dropped_cursor_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def drop_cursor(request: httpx.Request) -> httpx.Request:
        return rebuilt(request, url=request.url.copy_remove_param("cursor"))

    change_sent(monkeypatch, drop_cursor)
    with pytest.raises(CannotOverwriteExistingCassetteException):
        run_facade("list_envs")  # the first page again: its answer already played


# -- headers


def test_a_dropped_authorization_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    change_sent(monkeypatch, edit_headers(lambda headers, _: headers.pop("authorization")))
    with pytest.raises(CannotOverwriteExistingCassetteException) as caught:
        run_facade("get_env")
    assert "authorization: sent no Authorization header" in refusal(caught)


def test_an_authorization_of_another_shape_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def token_scheme(headers: httpx.Headers, _: httpx.Request) -> None:
        headers["authorization"] = headers["authorization"].replace("Bearer ", "Token ")

    change_sent(monkeypatch, edit_headers(token_scheme))
    with pytest.raises(CannotOverwriteExistingCassetteException) as caught:
        run_facade("get_env")
    assert "is not 'Bearer dak_<key>'" in refusal(caught)


def test_the_key_sent_to_an_env_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def leak_key(headers: httpx.Headers, request: httpx.Request) -> None:
        if request.url.path.startswith("/ingress/"):
            headers["authorization"] = f"Bearer {CASSETTE_KEY}"

    change_sent(monkeypatch, edit_headers(leak_key))
    with pytest.raises(CannotOverwriteExistingCassetteException) as caught:
        run_provider("ready")
    assert "sent an Authorization header the recording has none of" in refusal(caught)


def test_a_dropped_idempotency_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    change_sent(monkeypatch, edit_headers(lambda headers, _: headers.pop("idempotency-key", None)))
    with pytest.raises(CannotOverwriteExistingCassetteException) as caught:
        run_facade("create_sandbox")
    assert "idempotency_key: sent no Idempotency-Key" in refusal(caught)


def test_one_idempotency_key_for_two_creates_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    same = f"denv-{uuid.uuid4()}"
    for ops in (denv.client._operations, denv.client._operations_versions):
        monkeypatch.setattr(ops, "new_idempotency_key", lambda: same)
    with pytest.raises(AssertionError, match="do not pair one to one"):
        run_facade("fork")  # the create of the parent, then the fork


# -- a refusal the code under test swallows still fails the replay


def test_a_refused_request_that_was_caught_still_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def force_delete(request: httpx.Request) -> httpx.Request:
        if request.method != "DELETE":
            return request
        return rebuilt(request, url=request.url.copy_add_param("force", "1"))

    change_sent(monkeypatch, force_delete)
    # The provider deletes a crashed env "quietly": it logs the refusal and raises the crash.
    with pytest.raises(AssertionError, match=r"requests no recording matched: DELETE \S*\?force=1"):
        run_provider("crash_during_start")
