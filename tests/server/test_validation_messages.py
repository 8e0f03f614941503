"""The server's 422 for a malformed id or name says what the value should be, naming the
parameter as the request has it, not pydantic's "String should match pattern '^ver_...'".

The routes here take the same query parameters as the API's (openapi/denv.yaml) and go
through the server's own error handlers.
"""

from __future__ import annotations

from typing import Annotated

import pytest
from fastapi import FastAPI, Query
from fastapi.testclient import TestClient

from denv.server.errors import install_error_handlers

VERSION_ID = r"^ver_[0-9A-HJKMNP-TV-Z]{26}$"
PROJECT = r"^[a-z0-9][a-z0-9-]{0,62}$"


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/diff")
    def diff(base: Annotated[str, Query(pattern=VERSION_ID)]) -> dict[str, str]:
        return {"base": base}

    @app.get("/versions")
    def versions(project: Annotated[str, Query(pattern=PROJECT)]) -> dict[str, str]:
        return {"project": project}

    @app.get("/count")
    def count(n: Annotated[int, Query(ge=1)]) -> dict[str, int]:
        return {"n": n}

    return TestClient(app)


def test_a_bad_version_id_is_named_in_words(client: TestClient) -> None:
    res = client.get("/diff", params={"base": "not-a-version"})
    assert res.status_code == 422
    body = res.json()
    assert body["code"] == "invalid_request"
    assert body["message"].startswith("base: 'not-a-version' is not a version id (ver_ and 26")
    assert "pattern" not in body["message"]
    assert body["details"] == {"path": "query.base"}  # the machine-readable place is kept


def test_a_bad_project_name_is_named_in_words(client: TestClient) -> None:
    res = client.get("/versions", params={"project": "Echo"})
    assert res.json()["message"] == (
        "project: 'Echo' is not a project name (lower-case letters, digits and dashes)"
    )


def test_other_problems_keep_their_message(client: TestClient) -> None:
    res = client.get("/count", params={"n": 0})
    assert res.json()["message"] == "n: Input should be greater than or equal to 1"
