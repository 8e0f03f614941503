"""Ingress tokens are kept only as digests: the database file holds no token and no key.

A server of its own, a stand-in env made with an ``Idempotency-Key``, a fork of it (with a
key too), and a replay of both. Then the raw bytes of ``denv.db`` and its WAL and shared
memory files are searched for every ingress token and the API key: 0 occurrences. Each
token still routes, ``GET /v1/envs/{id}`` shows the same URL as the create, the replays
carry the same URLs, and after a restart of the server (same state dir) the same URLs
route again under its new port (the routes come back from their digests).
"""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import clean, docker_engine, start_server
from reliability_helpers import STANDIN, STANDIN_CMD, api, delete_all, ok, report

pytestmark = pytest.mark.e2e


def token_of(env: dict[str, Any]) -> str:
    (endpoint,) = env["endpoints"]
    assert endpoint["via"] == "ingress", endpoint
    return str(endpoint["url"]).rsplit("/ingress/", 1)[1]


def routes(url: str) -> bool:
    with httpx.Client(trust_env=False, timeout=30) as http:
        return http.get(url + "/health").status_code == 200


def raw_state(state_dir: Path) -> bytes:
    return b"".join(
        p.read_bytes()
        for p in (state_dir / n for n in ("denv.db", "denv.db-wal", "denv.db-shm"))
        if p.exists()
    )


def test_the_database_holds_no_token_and_no_key(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    docker_engine(STANDIN)
    state = tmp_path / "state"
    body = {"image": STANDIN, "command": STANDIN_CMD, "wait": "healthy"}
    fork_body = {"count": 1, "wait": "healthy"}
    create_key, fork_key = {"Idempotency-Key": "create-1"}, {"Idempotency-Key": "fork-1"}
    try:
        with start_server(state, cleanup=False) as srv, api(srv) as c:
            env = ok(c.post("/v1/sandboxes", json=body, headers=create_key))
            fork_url = f"/v1/envs/{env['id']}/fork"
            child = ok(c.post(fork_url, json=fork_body, headers=fork_key))["envs"][0]
            replay = ok(c.post("/v1/sandboxes", json=body, headers=create_key))
            fork_replay = ok(c.post(fork_url, json=fork_body, headers=fork_key))
            got = ok(c.get(f"/v1/envs/{env['id']}"), 200)
            routed = [routes(e["endpoints"][0]["url"]) for e in (env, child)]
            tokens = [token_of(env), token_of(child)]
            key, key_mode = srv.key, stat.S_IMODE((state / "ingress_key").stat().st_mode)
        raw = raw_state(state)
        with start_server(state) as again, api(again) as c:
            after = ok(c.get(f"/v1/envs/{env['id']}"), 200)
            # a new port (--port 0): the same tokens under the new server's URL
            routed_after = [routes(f"{again.url}/ingress/{t}") for t in tokens]
            delete_all(c)
    finally:
        clean(state)  # what a failure part way left (the first server leaves its envs running)
    found = {t: raw.count(t.encode()) for t in tokens}
    digests = sum(raw.count(hashlib.sha256(t.encode()).hexdigest().encode()) > 0 for t in tokens)
    report(
        request,
        f"token digests: {len(tokens)} ingress tokens and the key searched in {len(raw)} bytes "
        f"of denv.db/-wal/-shm: {sum(found.values())} and {raw.count(key.encode())} "
        f"occurrences; {digests}/{len(tokens)} digests there; routes {sum(routed)}/"
        f"{len(routed)}, after a restart {sum(routed_after)}/{len(routed_after)}",
    )
    assert raw, "the database is empty: nothing was searched"
    assert found == {t: 0 for t in tokens}, found
    assert raw.count(key.encode()) == 0
    assert digests == len(tokens)
    assert all(routed) and all(routed_after), (routed, routed_after)
    assert replay["endpoints"] == env["endpoints"]
    assert fork_replay["envs"][0]["endpoints"] == child["endpoints"]
    assert got["endpoints"] == env["endpoints"]
    assert token_of(after) == token_of(env)
    assert len(set(tokens)) == 2
    assert key_mode == 0o600
