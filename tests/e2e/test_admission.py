"""A refused request leaves nothing behind: every check that can refuse runs before a
version or an env is recorded (``denv/server/lifecycle/admission.py``).

Each create below is refused by a different check, on the real server and engine: a live
create of an image whose command cannot run live (409), an egress allowlist with a bad
entry (422), an allowlist naming a private address (422), a count above the per-request
limit (422). None of them may add a version: an orphan version would count against the
key's ``--max-versions-per-key`` for ever, and no env, container or network may appear.
"""

from __future__ import annotations

from typing import Any

import docker
import httpx
import pytest
from conftest import LocalDenv, instance_id

from denv.server.docker.boot import WARM_LABEL

pytestmark = pytest.mark.e2e

ECHO_IMAGE = "denv-echo-env:latest"

REFUSED: list[tuple[str, dict[str, Any], int, str]] = [
    (
        # Known once it serves (its server says so): the env and its version are deleted.
        "live, not a uvicorn server",
        {"live": True, "image": "denv-http-standin:latest"},
        409,
        "live_unsupported",
    ),
    ("allowlist, malformed entry", {"egress": {"allow": ["not a host!"]}}, 422, ""),
    ("allowlist, a private address", {"egress": {"allow": ["10.1.2.3"]}}, 422, ""),
    ("count above the limit", {"count": 33}, 422, "limit_exceeded"),
]


def _containers(server: LocalDenv) -> set[str]:
    """This server's env containers (other servers on the machine are not this test's),
    warm spares aside: a pool an earlier test asked for may still be refilling."""
    client = docker.from_env()
    mine = client.containers.list(
        all=True, filters={"label": f"denv.instance={instance_id(server.state_dir)}"}
    )
    return {c.id for c in mine if WARM_LABEL not in c.labels}


def _ids(c: httpx.Client, what: str) -> set[str]:
    res = c.get(f"/v1/{what}", params={"limit": 200})
    assert res.status_code == 200, res.text
    return {item["id"] for item in res.json()["items"]}


@pytest.mark.parametrize(("why", "extra", "status", "code"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_create_records_no_version(
    denv_server: LocalDenv, why: str, extra: dict[str, Any], status: int, code: str
) -> None:
    headers = {"Authorization": f"Bearer {denv_server.key}"}
    with httpx.Client(base_url=denv_server.url, headers=headers, trust_env=False) as c:
        versions, envs, containers = _ids(c, "versions"), _ids(c, "envs"), _containers(denv_server)
        res = c.post("/v1/sandboxes", json={"image": ECHO_IMAGE, **extra}, timeout=60)
        assert res.status_code == status, (why, res.status_code, res.text[:300])
        assert not code or res.json()["code"] == code, (why, res.text[:300])
        assert _ids(c, "versions") == versions, f"{why}: a version was left"
        assert _ids(c, "envs") == envs, f"{why}: an env was left"
        assert _containers(denv_server) == containers, f"{why}: a container was left"
