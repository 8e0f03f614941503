"""Bad input: boundary requests to every operation; 0 server errors, every 4xx explained.

tests/e2e/test_server_schemathesis.py generates requests from the contract; this adds the
boundary inputs a generator seldom reaches: huge and chunked bodies, deeply nested JSON,
unicode and NUL in ids, labels and names, negative and huge counts, unknown fields,
malformed compose files (YAML errors, alias bombs, wrong shapes), env var names with ``=``
or NUL, non-JSON bodies. Every answer must be below 500; every 4xx must carry a ``code``
from the contract's closed set and a message. Afterwards the server still serves: health
answers and a real env starts. Creates that would pass validation name an image the
engine does not have, so no container starts.

Alias bombs sit under an allowed ``x-`` key and are referenced from every place the compose
parser reads; each must be refused with 422 ``invalid_compose`` before it expands: the
server answers promptly and its resident and peak memory grow by less than 50 MB.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import LocalDenv, start_server
from reliability_helpers import (
    api,
    assert_nothing_left,
    delete_all,
    memory_kib,
    ok,
    report,
    standin,
)

pytestmark = pytest.mark.e2e

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "denv.yaml"
MISSING = "denv-bad-input-missing:0"
ENV = "env_01M8KZZZZZZZZZZZZZZZZZZZZZ"
VER = "ver_01M8KZZZZZZZZZZZZZZZZZZZZZ"
MIB = 1024 * 1024

BOMB_LEVELS = 7  # 9**8 leaves: a 226 MB string once expanded (9 levels: ~20 GB from ~650 bytes)


def alias_bomb(levels: int = BOMB_LEVELS) -> str:
    """A "billion laughs" under an allowed ``x-`` key: anchor ``b<levels>`` is 9**(levels+1)
    leaves. A regressed server expands it whole; the default size fails the memory check
    plainly while staying survivable on a shared CI machine."""
    lines = ["x-bomb:", "  b0: &b0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"  b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


TOP = f"*b{BOMB_LEVELS}"  # the largest anchor of alias_bomb()


def compose(service: str) -> str:
    return f"services:\n  agent:\n{service}\nx-denv:\n  agent: {{service: agent}}\n"


COMPOSE_CASES = [
    "",
    "   ",
    "{",
    "services: [",
    "- just\n- a\n- list",
    "42",
    "null",
    "services: {}",
    "services:\n  agent: 5\n",
    compose(f"    image: {MISSING}"),  # no x-denv problem: a valid one (image missing)
    "services:\n  agent:\n    image: x\n",  # no x-denv
    compose("    image: [a, b]"),
    compose(f"    image: {MISSING}\n    ports: [-1, 70000, abc]"),
    compose(f"    image: {MISSING}\n    volumes: ['/etc:/etc', '../../x:/y']"),
    compose(f"    image: {MISSING}\n    environment: ['A=B=C', '=x', 'BAD NAME=1']"),
    compose(f"    image: {MISSING}\n    environment: {{'A=B': x, 'N\\0UL': y}}"),
    compose(f"    image: {MISSING}\n    depends_on: [agent]"),
    compose(f"    image: {MISSING}\n    depends_on: [ghost]"),
    compose(f"    image: {MISSING}\n    healthcheck: {{test: 5}}"),
    compose(f"    image: {MISSING}\n    command: {{a: b}}"),
    compose(f"    image: {MISSING}\n    privileged: true"),
    compose("    image: 'ünïcødé/ïmage:☃'"),
    "services:\n  'ag ent':\n    image: x\nx-denv:\n  agent: {service: 'ag ent'}\n",
    "services:\n  agent: {image: x}\nx-denv: {agent: {service: nobody}}\n",
    "services:\n  agent: {image: x}\nx-denv: {agent: {service: agent, health_path: 5}}\n",
    "!!python/object/apply:os.system ['true']",
    alias_bomb() + compose(f"    image: {MISSING}\n    environment: {{BOMB: {TOP}}}"),
    alias_bomb() + compose(f"    image: {MISSING}\n    command: {TOP}"),
    alias_bomb() + compose(f"    image: {TOP}"),
    "x-a: &x {image: x}\nservices:\n  agent: *x\n  db:\n    <<: *x\n    ports: *x\n",
    "\t\x00\x01binary",
    "services:\n" + "".join(f"  s{i}: {{image: {MISSING}}}\n" for i in range(2000)),
]


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, request kwargs) for httpx."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    sandbox: dict[str, Any] = {"image": MISSING}
    bodies: list[Any] = [
        {},
        [],
        "x",
        None,
        0,
        {"image": ""},
        {"image": "\x00"},
        {"image": "ünïcødé:☃"},
        {"image": "a" * 100000},
        {**sandbox, "unknown": 1},
        {**sandbox, "ports": []},
        {**sandbox, "ports": [0]},
        {**sandbox, "ports": [-1]},
        {**sandbox, "ports": [2**63]},
        {**sandbox, "ports": [8000.5]},
        {**sandbox, "ports": ["8000"]},
        {**sandbox, "ports": list(range(1, 100))},
        {**sandbox, "env": {"A=B": "x"}},
        {**sandbox, "env": {"A\x00B": "x"}},
        {**sandbox, "env": {"": "x"}},
        {**sandbox, "env": {"A": "\x00"}},
        {**sandbox, "env": {"A": 5}},
        {**sandbox, "env": {f"V{i}": "x" for i in range(300)}},
        {**sandbox, "command": ["\x00"]},
        {**sandbox, "command": "sh -c true"},
        {**sandbox, "command": [1, 2]},
        {**sandbox, "volumes": ["relative"]},
        {**sandbox, "volumes": ["/a\x00b"]},
        {**sandbox, "volumes": ["/"] * 9},
        {**sandbox, "labels": {"ü☃": "ö" * 255}},
        {**sandbox, "labels": {"": "x"}},
        {**sandbox, "labels": {"k": "v" * 256}},
        {**sandbox, "labels": {f"k{i}": "v" for i in range(33)}},
        {**sandbox, "labels": {"k": None}},
        {**sandbox, "egress": "sometimes"},
        {**sandbox, "wait": "forever"},
        {**sandbox, "ttl_s": -1},
        {**sandbox, "ttl_s": 0},
        {**sandbox, "ttl_s": 10**30},
        {**sandbox, "ttl_s": float("1e308")},
        {**sandbox, "wait_timeout_s": -5},
        {**sandbox, "wait_timeout_s": 0},
        {**sandbox, "health_path": "no-slash"},
        {**sandbox, "health_path": "/\x00"},
        {**sandbox, "pull": "yes"},
        {**sandbox, "warm": -1},
        {**sandbox, "warm": 33},
    ]
    out += [("POST", "/v1/sandboxes", {"json": b}) for b in bodies]
    counts: list[Any] = [-1, 0, 33, 10**6, 2**64, -(2**64), 1.5, "2", None, True, [1]]
    for path in (f"/v1/envs/{ENV}/fork", f"/v1/versions/{VER}/envs"):
        out += [("POST", path, {"json": {"count": n}}) for n in counts]
        out += [
            ("POST", path, {"json": {"count": 1, "unknown": True}}),
            ("POST", path, {"json": {"env": {"A=B": "1"}}}),
            ("POST", path, {"json": {"env": {"A\x00": "1"}}}),
            ("POST", path, {"json": {"egress": "open"}}),
            ("POST", path, {"json": []}),
        ]
    out += [
        ("POST", "/v1/projects/p/deploy", {"json": {"compose": text}}) for text in COMPOSE_CASES
    ]
    out += [
        ("POST", "/v1/projects/p/deploy", {"json": {"compose": 5}}),
        ("POST", "/v1/projects/p/deploy", {"json": {"compose": "x" * 262145}}),
        ("POST", "/v1/projects/p/deploy", {"json": {"compose": "services: {}", "x": 1}}),
    ]
    for name in ("P", "ü", "-x", "a" * 64, "a%00b", "a..b", "%2e%2e"):
        out.append(("POST", f"/v1/projects/{name}/deploy", {"json": {"compose": "x"}}))
    weird_ids = [
        "env_",
        "ünïcødé",
        "env_" + "Z" * 10000,
        "%00",
        "..%2f..%2fetc",
        ENV.lower(),
        VER,
        "env_01M8KZZZZZZZZZZZZZZZZZZZZZ%20",
    ]
    for ident in weird_ids:
        out += [
            ("GET", f"/v1/envs/{ident}", {}),
            ("DELETE", f"/v1/envs/{ident}", {}),
            ("POST", f"/v1/envs/{ident}/wait", {"json": {}}),
            ("GET", f"/v1/envs/{ident}/logs", {}),
            ("POST", f"/v1/envs/{ident}/snapshot", {}),
            ("GET", f"/v1/versions/{ident}", {}),
            ("DELETE", f"/v1/versions/{ident}", {}),
        ]
    queries: list[tuple[str, dict[str, Any]]] = [
        ("/v1/envs", {"limit": -1}),
        ("/v1/envs", {"limit": 0}),
        ("/v1/envs", {"limit": 10**30}),
        ("/v1/envs", {"limit": "ten"}),
        ("/v1/envs", {"cursor": "x" * 10000}),
        ("/v1/envs", {"cursor": "ü\x00"}),
        ("/v1/envs", {"status": "zombie"}),
        ("/v1/envs", {"version_id": "ver_x"}),
        ("/v1/versions", {"project": "Ü"}),
        ("/v1/projects", {"limit": 201}),
        (f"/v1/envs/{ENV}/logs", {"tail": -5}),
        (f"/v1/envs/{ENV}/logs", {"tail": 10**9}),
        (f"/v1/envs/{ENV}/logs", {"service": "a/b"}),
    ]
    out += [("GET", path, {"params": params}) for path, params in queries]
    out += [
        ("POST", f"/v1/envs/{ENV}/wait", {"json": {"until": "forever"}}),
        ("POST", f"/v1/envs/{ENV}/wait", {"json": {"timeout_s": -1}}),
        ("POST", f"/v1/envs/{ENV}/snapshot", {"json": {"labels": {"k": 1}}}),
        ("POST", "/v1/sandboxes", {"content": b"{not json"}),
        ("POST", "/v1/sandboxes", {"content": b"\xff\xfe\x00"}),
        ("POST", "/v1/sandboxes", {"content": b'{"image": "a"', "headers": {"X": "y"}}),
        ("POST", "/v1/sandboxes", {"content": b"[" * 100000 + b"]" * 100000}),
        ("POST", "/v1/sandboxes", {"content": b'{"a":' * 50000 + b"1" + b"}" * 50000}),
        ("POST", "/v1/sandboxes", {"content": b"x" * (2 * MIB)}),
        ("POST", "/v1/sandboxes", {"content": _chunked(3 * MIB)}),
        (
            "POST",
            "/v1/sandboxes",
            {"content": b'{"image": "x"}', "headers": {"Content-Type": "text/plain"}},
        ),
        ("POST", "/v1/sandboxes", {"json": sandbox, "headers": {"Idempotency-Key": ""}}),
        ("POST", "/v1/sandboxes", {"json": sandbox, "headers": {"Idempotency-Key": "k" * 256}}),
        ("PATCH", "/v1/sandboxes", {}),
        ("PUT", f"/v1/envs/{ENV}", {}),
        ("GET", "/v1/" + "a/" * 2000, {}),
    ]
    return out


def _chunked(size: int) -> Iterator[bytes]:
    """A body sent without Content-Length (chunked), larger than the 1 MiB limit."""
    chunk = b" " * 65536
    for _ in range(size // len(chunk)):
        yield chunk


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-bad-input")) as srv:
        yield srv


def error_codes() -> set[str]:
    spec = yaml.safe_load(SPEC.read_text())
    return set(spec["components"]["schemas"]["ErrorCode"]["enum"])


def test_boundary_inputs(server: LocalDenv, request: pytest.FixtureRequest) -> None:
    codes = error_codes()
    problems: list[str] = []
    statuses: dict[int, int] = {}
    checked = 0
    with api(server, timeout=120) as c:
        for method, path, kwargs in cases():
            try:
                res = c.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                problems.append(f"{method} {path[:80]}: no answer ({type(exc).__name__})")
                continue
            checked += 1
            statuses[res.status_code] = statuses.get(res.status_code, 0) + 1
            where = f"{method} {path[:80]} {str(kwargs)[:120]!r} -> {res.status_code}"
            if res.status_code >= 500:
                problems.append(f"{where}: {res.text[:300]}")
            elif res.status_code >= 400:
                try:
                    body = res.json()
                except ValueError:
                    problems.append(f"{where}: not JSON: {res.text[:200]}")
                    continue
                if body.get("code") not in codes or not body.get("message"):
                    problems.append(f"{where}: no code/message: {res.text[:300]}")
            elif method != "GET" and res.status_code not in (200, 204):
                problems.append(f"{where}: accepted")
        for content in (b"x" * (2 * MIB), _chunked(3 * MIB)):  # with and without a length
            res = c.post("/v1/sandboxes", content=content)
            assert res.status_code == 422 and "1 MiB" in res.json()["message"], res.text
        # the server keeps serving: health, and a real env starts and goes
        assert ok(c.get("/v1/health"), 200)["status"] == "ok"
        env = standin(c)
        assert env["status"] == "healthy", env
        delete_all(c)
    summary = ", ".join(f"{n}x{s}" for s, n in sorted(statuses.items()))
    report(
        request,
        f"bad input: {checked} boundary requests ({summary}), "
        f"{sum(n for s, n in statuses.items() if s >= 500)} server errors, "
        f"{len(problems)} problems; server still serving",
    )
    assert not problems, "\n".join(problems)
    assert_nothing_left(request, server.state_dir, "bad input: after", quiet=True)


# Every place the compose parser reads a value, each fed the same alias bomb. The old
# parser refused most of them cheaply but expanded two (str() of an environment value, the
# repr of x-denv.agent.service in its message); the bound must refuse all of them at load.
PORTS = "    ports: ['8000']"
BOMB_PLACES = {
    "environment value": compose(f"    image: {MISSING}\n{PORTS}\n    environment: {{B: {TOP}}}"),
    "environment list": compose(f"    image: {MISSING}\n{PORTS}\n    environment: [{TOP}]"),
    "command list": compose(f"    image: {MISSING}\n{PORTS}\n    command: [sh, {TOP}]"),
    "labels": compose(f"    image: {MISSING}\n{PORTS}\n    labels: {{a: {TOP}}}"),
    "nested lists": compose(f"    image: {MISSING}\n    ports: [[[{TOP}]]]"),
    "merge key": compose(f"    image: {MISSING}\n{PORTS}\n    <<: {{x: {TOP}}}"),
    "x-denv agent service": (
        f"services:\n  agent:\n    image: {MISSING}\n{PORTS}\n"
        f"x-denv:\n  agent: {{service: {TOP}}}\n"
    ),
}
# Refused at the anchor that first grows past the bound, before any value is built.
REFUSED = re.compile(r"^x-bomb\.b\d: YAML aliases expand this to more than \d+ nodes")
MEMORY_GROWTH_KIB = 50 * 1024
PROMPT_S = 5.0


def test_alias_bombs_refused_before_expanding(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # A server of its own: its peak memory (VmHWM) is then this test's alone.
    with start_server(tmp_path / "state") as srv, api(srv, timeout=60) as c:
        assert srv.proc is not None
        ok(c.get("/v1/health"), 200)
        before = memory_kib(srv.proc.pid)
        slowest = 0.0
        for place, text in BOMB_PLACES.items():
            started = time.monotonic()
            res = c.post("/v1/projects/bomb/deploy", json={"compose": alias_bomb() + text})
            took = time.monotonic() - started
            assert res.status_code == 422, (place, res.status_code, res.text[:300])
            body = res.json()
            assert body["code"] == "invalid_compose", (place, body)
            assert REFUSED.match(body["message"]), (place, body["message"][:300])
            assert "write the values out" in body["message"], body["message"]
            started = time.monotonic()
            assert ok(c.get("/v1/health"), 200)["status"] == "ok"
            slowest = max(slowest, took, time.monotonic() - started)
        after = memory_kib(srv.proc.pid)
    growth = {k: after[k] - before[k] for k in before}
    report(
        request,
        f"bad input: {len(BOMB_PLACES)} alias bombs ({len(alias_bomb())} bytes, "
        f"9**{BOMB_LEVELS + 1} leaves each) refused with 422, slowest answer {slowest:.2f} s, "
        "memory growth "
        f"{growth['VmRSS'] // 1024} MiB resident, {growth['VmHWM'] // 1024} MiB peak",
    )
    assert slowest < PROMPT_S, f"the server took {slowest:.1f} s to answer"
    assert growth["VmRSS"] < MEMORY_GROWTH_KIB and growth["VmHWM"] < MEMORY_GROWTH_KIB, growth
