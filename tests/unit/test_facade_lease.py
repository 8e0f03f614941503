"""The client's side of a lease, on a stand-in server (the renewals run on a timer, which no
recorded cassette can line up; tests/e2e/test_leases.py runs them against a real server).

One lease per client, opened at the first create and sent with every create and fork;
renewed from a thread; closed with the client; a lease the server ended makes the next
create raise `LeaseExpired` without sending it; a detached client never opens one.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from facade_fakes import KEY, SERVER, env_json, make_denv

from denv import LeaseExpired

LEASE_ID = "lse_01JDQ5C8M9W3X7Y2Z4A6B8C0D1"
pytestmark = pytest.mark.timeout(30)


def lease_json(state: str = "open", timeout_s: float = 0.3) -> dict[str, Any]:
    return {
        "id": LEASE_ID,
        "state": state,
        "timeout_s": timeout_s,
        "expires_at": "2025-01-01T00:00:01Z",
        "created_at": "2025-01-01T00:00:00Z",
        "ended_at": None,
        "envs": 1,
    }


class Server:
    """Answers what a lease needs; `ended` makes it refuse the lease from then on."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []
        self.ended = False
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        with self.lock:
            self.seen.append((request.method, request.url.path, body))
        path = request.url.path
        gone = {
            "code": "conflict",
            "message": f"lease {LEASE_ID} expired at 2025-01-01T00:00:01Z: no renewal for 5 s",
            "request_id": "req_1",
            "details": {"lease_id": LEASE_ID, "state": "expired"},
        }
        if path == "/v1/leases":
            return httpx.Response(201, json=lease_json())
        if path.endswith("/renew") or (path == "/v1/sandboxes" and self.ended):
            return (
                httpx.Response(409, json=gone)
                if self.ended
                else httpx.Response(200, json=lease_json())
            )
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(201, json=env_json())

    def paths(self, method: str | None = None) -> list[str]:
        with self.lock:
            return [p for m, p, _ in self.seen if method is None or m == method]


@pytest.fixture
def server() -> Server:
    return Server()


def test_one_lease_is_opened_sent_renewed_and_closed(kind: str, server: Server) -> None:
    denv = make_denv(kind, SERVER, KEY, detach=False, _transport=httpx.MockTransport(server))
    denv.create_sandbox("echo:latest")
    denv.create_sandbox("echo:latest")
    assert server.paths().count("/v1/leases") == 1  # one per client, not per env
    creates = [b for m, p, b in server.seen if p == "/v1/sandboxes"]
    assert [b["lease_id"] for b in creates] == [LEASE_ID, LEASE_ID]
    time.sleep(0.35)  # a 0.3 s lease is renewed every 0.1 s
    assert server.paths().count(f"/v1/leases/{LEASE_ID}/renew") >= 2
    denv.close()
    assert server.paths("DELETE") == [f"/v1/leases/{LEASE_ID}"]
    renewals = server.paths().count(f"/v1/leases/{LEASE_ID}/renew")
    time.sleep(0.25)
    assert server.paths().count(f"/v1/leases/{LEASE_ID}/renew") == renewals  # stopped


def test_a_lease_the_server_ended_fails_the_next_create_at_once(kind: str, server: Server) -> None:
    denv = make_denv(kind, SERVER, KEY, detach=False, _transport=httpx.MockTransport(server))
    denv.create_sandbox("echo:latest")
    server.ended = True
    renewals = server.paths().count(f"/v1/leases/{LEASE_ID}/renew")
    deadline = time.monotonic() + 5  # the next renewal (every 0.1 s) gets the 409
    while server.paths().count(f"/v1/leases/{LEASE_ID}/renew") == renewals:
        assert time.monotonic() < deadline, "no renewal after the lease ended"
        time.sleep(0.02)
    time.sleep(0.05)  # its answer read: the keeper has stopped
    sent = len(server.seen)
    with pytest.raises(LeaseExpired) as info:
        denv.create_sandbox("echo:latest")
    assert info.value.lease_id == LEASE_ID and "expired" in str(info.value)
    assert len(server.seen) == sent  # known lost: not sent
    denv.close()
    assert server.paths("DELETE") == []  # nothing to close


def test_a_detached_client_opens_no_lease(kind: str, server: Server) -> None:
    denv = make_denv(kind, SERVER, KEY, detach=True, _transport=httpx.MockTransport(server))
    denv.create_sandbox("echo:latest")
    denv.close()
    assert server.paths() == ["/v1/sandboxes"]
    assert "lease_id" not in server.seen[0][2]


def test_a_given_lease_is_sent_but_neither_renewed_nor_closed(kind: str, server: Server) -> None:
    denv = make_denv(kind, SERVER, KEY, lease_id=LEASE_ID, _transport=httpx.MockTransport(server))
    denv.create_sandbox("echo:latest")
    time.sleep(0.2)
    denv.close()
    assert server.paths() == ["/v1/sandboxes"] and server.seen[0][2]["lease_id"] == LEASE_ID
