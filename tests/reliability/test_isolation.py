"""Isolation between API keys, and ingress capability tokens.

Key B gets 404 ``not_found`` for every operation on key A's envs and versions (never 403:
B learns nothing about what exists), and its lists show none of A's. An ingress URL is
reached only with its token: not without one, not with a wrong or truncated one, not with
one that differs in a single character, not with an API key. Tokens carry at least 128 bits
and differ between envs. Tests never assert on time, so the constant-time lookups are
checked by their shape: a key is compared (``hmac.compare_digest``, on digests, never the
key) with every stored digest whichever matches, or none; the ingress table holds only
SHA-256 digests of tokens, so a lookup probes by a digest no caller can steer.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import LocalDenv, start_server
from reliability_helpers import STANDIN, api, assert_nothing_left, delete_all, ok, report, standin

pytestmark = pytest.mark.e2e

COMPOSE = f"""
services:
  agent:
    image: {STANDIN}
    ports: ["8000"]
x-denv:
  agent: {{service: agent}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-isolation")) as srv:
        yield srv


def test_other_key_gets_404_everywhere(server: LocalDenv, request: pytest.FixtureRequest) -> None:
    from denv.server.auth import create_api_key

    key_b = create_api_key(server.state_dir)
    with api(server) as a, api(server, key_b) as b:
        env = standin(a)
        snap = ok(a.post(f"/v1/envs/{env['id']}/snapshot", json={}))
        deployed = ok(a.post("/v1/projects/iso-a/deploy", json={"compose": COMPOSE}))
        env_ops: list[tuple[str, str, dict[str, Any] | None]] = [
            ("GET", "/v1/envs/{e}", None),
            ("DELETE", "/v1/envs/{e}", None),
            ("POST", "/v1/envs/{e}/wait", {"timeout_s": 1}),
            ("GET", "/v1/envs/{e}/logs", None),
            ("POST", "/v1/envs/{e}/snapshot", {}),
            ("POST", "/v1/envs/{e}/fork", {"count": 1}),
        ]
        version_ops: list[tuple[str, str, dict[str, Any] | None]] = [
            ("GET", "/v1/versions/{v}", None),
            ("DELETE", "/v1/versions/{v}", None),
            ("POST", "/v1/versions/{v}/envs", {"count": 1}),
        ]
        checked = 0
        for method, path, body in env_ops:
            res = b.request(method, path.format(e=env["id"]), json=body)
            assert res.status_code == 404, (method, path, res.text)
            assert res.json()["code"] == "not_found", res.text
            checked += 1
        for version in (env["version_id"], snap["id"], deployed["id"]):
            for method, path, body in version_ops:
                res = b.request(method, path.format(v=version), json=body)
                assert res.status_code == 404, (method, path, res.text)
                assert res.json()["code"] == "not_found", res.text
                checked += 1
        assert ok(b.get("/v1/envs"), 200)["items"] == []
        assert ok(b.get("/v1/versions"), 200)["items"] == []
        assert ok(b.get("/v1/projects"), 200)["items"] == []
        assert ok(b.get("/v1/envs", params={"version_id": snap["id"]}), 200)["items"] == []
        checked += 4
        # B deploying a project of the same name makes B's own; A's is untouched.
        b_version = ok(b.post("/v1/projects/iso-a/deploy", json={"compose": COMPOSE}))
        assert b_version["id"] != deployed["id"]
        a_projects = ok(a.get("/v1/projects"), 200)["items"]
        assert [p["latest_version_id"] for p in a_projects] == [deployed["id"]]
        checked += 1
        # Everything of A's still works for A after B's attempts.
        assert ok(a.get(f"/v1/envs/{env['id']}"), 200)["status"] == "healthy"
        assert ok(a.get(f"/v1/versions/{snap['id']}"), 200)["id"] == snap["id"]
        delete_all(a)
    report(request, f"isolation: {checked} operations of key B on key A's things, all 404/empty")
    assert_nothing_left(request, server.state_dir, "isolation: after deletes", quiet=True)


def near_misses(secret: str) -> list[str]:
    """The secret with one character changed: the last, the first and a middle one."""
    out = []
    for i in (len(secret) - 1, 0, len(secret) // 2):
        other = "A" if secret[i] != "A" else "B"
        out.append(secret[:i] + other + secret[i + 1 :])
    return out


def test_ingress_needs_its_token(server: LocalDenv, request: pytest.FixtureRequest) -> None:
    with api(server) as c:
        envs = [standin(c) for _ in range(3)]
        urls = [e["endpoints"][0]["url"] for e in envs]
        tokens = [urlsplit(u).path.split("/")[2] for u in urls]
        assert len(set(tokens)) == len(tokens)
        for token in tokens:
            assert len(token) >= 22, token  # URL-safe base64: 6 bits a character, >= 128 bits
        base = f"{server.url}/ingress"
        token = tokens[0]
        attempts = [
            *(f"{base}/{near}/health" for near in near_misses(token)),
            f"{base}/health",
            f"{base}/",
            f"{base}/{token[:-1]}/health",
            f"{base}/{token[:22]}/health",
            f"{base}/{token}x/health",
            f"{base}/{token.upper()}/health",
            f"{base}/{secrets.token_urlsafe(24)}/health",
            f"{base}/{server.key}/health",
            f"{base}/{envs[0]['id']}/health",
            f"{base}/%2e%2e/{token}/health",
        ]
        refused = 0
        with httpx.Client(trust_env=False, timeout=10) as http:
            for url in attempts:
                res = http.get(url, headers={"Authorization": f"Bearer {server.key}"})
                assert res.status_code == 404, (url, res.status_code, res.text)
                assert token not in res.text and server.key not in res.text
                refused += 1
            for url in urls:  # positive control: the real URLs answer
                assert http.get(f"{url}/health").status_code == 200
        delete_all(c)
    report(
        request,
        f"isolation: {refused} ingress attempts without the right token, 0 reached an env; "
        f"{len(tokens)} tokens of >= {min(len(t) for t in tokens) * 6} bits, all distinct",
    )


def test_keys_and_tokens_compared_in_constant_time(
    server: LocalDenv,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    from denv.server import auth
    from denv.server.db import Store
    from denv.server.ingress import proxy as ingress

    # Through the real server: a key one character off is refused, the key itself is not.
    with httpx.Client(base_url=server.url, trust_env=False, timeout=10) as http:
        for near in near_misses(server.key):
            res = http.get("/v1/envs", headers={"Authorization": f"Bearer {near}"})
            assert res.status_code == 401, (near, res.status_code, res.text)
        assert http.get("/v1/envs", headers={"Authorization": f"Bearer {server.key}"}).is_success

    # The key ring compares with every stored digest, whichever matches: no early exit
    # tells a caller how far down the list its key is, or how much of it was right.
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def watched(a: Any, b: Any) -> bool:
        calls.append((str(a), str(b)))
        return real(a, b)

    store = Store(tmp_path / "denv.db")
    try:
        keys = [auth.new_key() for _ in range(5)]
        assert all(len(k) - len("dak_") >= 43 for k in keys)  # 256 bits
        for k in keys:
            store.add_key_digest(auth.digest(k))
        ring = auth.KeyRing(store)
        monkeypatch.setattr(hmac, "compare_digest", watched)
        counts: dict[str, int] = {}
        for name, presented, owner in (
            ("first", keys[0], auth.digest(keys[0])),
            ("last", keys[-1], auth.digest(keys[-1])),
            ("one off", near_misses(keys[-1])[0], None),
            ("unknown", "dak_" + "x" * 43, None),
        ):
            calls.clear()
            assert ring.owner_of(presented) == owner, name
            counts[name] = len(calls)
            assert all(len(a) == len(b) == 64 for a, b in calls), calls  # hex digests
            assert not any(k in a + b for k in keys for a, b in calls)  # never a key
        monkeypatch.undo()
    finally:
        store.close()
    # a miss is checked twice (again after re-reading the store for keys added meanwhile)
    assert counts == {"first": 5, "last": 5, "one off": 10, "unknown": 10}, counts

    # The ingress table keeps SHA-256 digests, never a token: the lookup is a dict probe
    # by a digest, which a caller cannot steer towards a registered token.
    table = ingress.IngressTable()
    tokens = [ingress.new_token() for _ in range(3)]
    assert all(len(t) * 6 >= 128 for t in tokens)
    for i, t in enumerate(tokens):
        table.register(t, f"10.213.0.{i + 2}", 8000)
    state = repr(vars(table))
    assert not any(t in state for t in tokens), "the ingress table holds a raw token"
    assert set(vars(table)["_targets"]) == {hashlib.sha256(t.encode()).digest() for t in tokens}
    assert table.resolve(tokens[0]) == ("10.213.0.2", 8000)
    assert all(table.resolve(near) is None for t in tokens for near in near_misses(t))
    report(
        request,
        f"isolation: {len(near_misses(server.key))} keys one character off refused by the "
        f"server; every key lookup compared digests with all {len(keys)} stored ones "
        f"({counts}); the ingress table holds {len(tokens)} token digests and no token",
    )
