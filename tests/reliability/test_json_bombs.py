"""JSON bombs against every JSON body of the API: 422 before parsing, memory kept.

Each bomb fits the 1 MiB body cap, and each would cost the server far more once parsed
(hundreds of thousands of lists, a number of a hundred thousand digits, a string past
the longest field). The server must refuse each with 422 ``invalid_request`` whose
message names the bound, and its resident and peak memory (VmRSS, VmHWM) must grow by
less than 50 MB over all of them. Counts: 3 rounds in CI, 30 under ``make soak``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import start_server
from reliability_helpers import api, memory_kib, ok, report, scale

pytestmark = pytest.mark.e2e

ENV = "env_01M8KZZZZZZZZZZZZZZZZZZZZZ"
VER = "ver_01M8KZZZZZZZZZZZZZZZZZZZZZ"
BODY_CAP = 1024 * 1024 - 64
MEMORY_GROWTH_KIB = 50 * 1024

# Every operation that reads a JSON body.
TARGETS = [
    "/v1/sandboxes",
    f"/v1/envs/{ENV}/wait",
    f"/v1/envs/{ENV}/snapshot",
    f"/v1/envs/{ENV}/fork",
    f"/v1/versions/{VER}/envs",
    "/v1/projects/bomb/deploy",
]


def bombs() -> dict[str, tuple[bytes, str]]:
    """name -> (body, what the refusal must name)."""
    wide = b"[" + b"[]," * (BODY_CAP // 3 - 1) + b"[]]"
    keys = b"{" + b",".join(b'"k%d":0' % i for i in range(100000)) + b"}"
    return {
        "deep arrays": (b"[" * BODY_CAP, "nested deeper than"),
        "deep objects": (b'{"a":' * (BODY_CAP // 5), "nested deeper than"),
        "wide arrays": (wide, "JSON values"),
        "many keys": (keys[:BODY_CAP].rsplit(b",", 1)[0] + b"}", "JSON values"),
        "huge number": (b'{"count": ' + b"9" * (BODY_CAP - 16) + b"}", "JSON number"),
        "huge string": (json.dumps({"image": "x" * (BODY_CAP - 32)}).encode(), "JSON string"),
    }


def test_json_bombs_refused_before_parsing(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    rounds = scale(3, 30)
    bodies = bombs()
    refused = 0
    # A server of its own: its peak memory (VmHWM) is then this test's alone.
    with start_server(tmp_path / "state") as srv, api(srv, timeout=60) as c:
        assert srv.proc is not None
        ok(c.get("/v1/health"), 200)
        before = memory_kib(srv.proc.pid)
        for _ in range(rounds):
            for name, (body, named) in bodies.items():
                assert len(body) <= BODY_CAP + 64, (name, len(body))
                for path in TARGETS:
                    res = c.post(path, content=body, headers={"content-type": "application/json"})
                    assert res.status_code == 422, (name, path, res.status_code, res.text[:300])
                    err = res.json()
                    assert err["code"] == "invalid_request", (name, path, err)
                    assert named in err["message"], (name, path, err["message"])
                    refused += 1
        assert ok(c.get("/v1/health"), 200)["status"] == "ok"
        after = memory_kib(srv.proc.pid)
    growth = {k: after[k] - before[k] for k in before}
    report(
        request,
        f"json bombs: {len(bodies)} kinds x {len(TARGETS)} operations x {rounds} rounds = "
        f"{refused} refused with 422 (each up to 1 MiB); memory growth "
        f"{growth['VmRSS'] // 1024} MiB resident, {growth['VmHWM'] // 1024} MiB peak",
    )
    assert growth["VmRSS"] < MEMORY_GROWTH_KIB and growth["VmHWM"] < MEMORY_GROWTH_KIB, growth
