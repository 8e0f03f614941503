"""Hardening: limits, dropped capabilities, private state, the API key never reaches an env.

A server of its own with small per-container limits (``--env-memory 256 --env-pids 128``)
runs envs of the probe image with a small app (``APP``) that can fork-bomb itself, hog
memory, probe what the kernel refuses it, and echo the headers it was sent. A sibling env
runs beside each attack and must stay healthy; so must the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, docker_engine, start_server
from reliability_helpers import E2E_DIR, api, container_of, delete_all, ok, report

pytestmark = pytest.mark.e2e

PROBE = "denv-base-probe:latest"
MEMORY_MB = 256
PIDS = 128

# The app each probe env runs (its routes in its docstring), shared with tests/e2e/test_gvisor.py.
APP = (E2E_DIR / "hardening_app.py").read_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    docker_engine(PROBE)
    limits = ("--env-memory", str(MEMORY_MB), "--env-pids", str(PIDS))
    with start_server(tmp_path_factory.mktemp("denv-hardening"), *limits) as srv:
        yield srv


def probe_env(c: httpx.Client) -> dict[str, Any]:
    return ok(c.post("/v1/sandboxes", json={"image": PROBE, "command": ["python3", "-c", APP]}))


def get(env: dict[str, Any], path: str, **kw: Any) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=kw.pop("timeout", 30)) as http:
        return http.get(env["endpoints"][0]["url"] + path, **kw)


def healthy(c: httpx.Client, env: dict[str, Any]) -> bool:
    status = ok(c.get(f"/v1/envs/{env['id']}"), 200)["status"]
    return status == "healthy" and get(env, "/health").status_code == 200


def host_forks(n: int) -> int:
    """Processes the host still starts (each `true` exiting 0)."""
    return sum(subprocess.run(["true"], check=False).returncode == 0 for _ in range(n))


def test_fork_bomb_stops_at_the_pids_limit(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    with api(server) as c:
        bomber, sibling = probe_env(c), probe_env(c)
        started = time.monotonic()
        res = get(bomber, "/bomb", timeout=60)
        took = time.monotonic() - started
        assert res.status_code == 200, res.text
        result = res.json()
        checks = [healthy(c, bomber), healthy(c, sibling), host_forks(5) == 5]
        delete_all(c)
    report(
        request,
        f"hardening: a fork bomb forked {result['forked']} children before the pids limit "
        f"({PIDS}) refused more ({result['error']}) in {took:.1f} s; bomber, sibling and "
        f"host fine: {sum(checks)}/{len(checks)}",
    )
    assert result["error"] == "EAGAIN" and 0 < result["forked"] < PIDS, result
    assert all(checks), checks


def test_memory_hog_fails_its_env_out_of_memory(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    with api(server) as c:
        hog, sibling = probe_env(c), probe_env(c)
        with contextlib.suppress(httpx.HTTPError):  # no answer: the app dies mid-request
            get(hog, "/hog", timeout=60)
        deadline = time.monotonic() + 60
        while (env := ok(c.get(f"/v1/envs/{hog['id']}"), 200))["status"] != "failed":
            assert time.monotonic() < deadline, env
            time.sleep(0.5)
        error = env["error"]
        sibling_ok = healthy(c, sibling)
        delete_all(c)
    report(
        request,
        f"hardening: a memory hog past {MEMORY_MB} MiB: env {env['status']} "
        f"({error['code']}: {error['message']!r}), {len(error['log_tail'])} log lines; "
        f"sibling healthy: {sibling_ok}",
    )
    assert "out of memory" in error["message"], error
    assert any("hogging" in line for line in error["log_tail"]), error
    assert sibling_ok


def test_capabilities_are_dropped(server: LocalDenv, request: pytest.FixtureRequest) -> None:
    engine = docker_engine(PROBE)
    with api(server) as c:
        env = probe_env(c)
        res = get(env, "/caps")
        assert res.status_code == 200, res.text
        found = res.json()
        work = found.pop("work_mount")
        still = healthy(c, env)
        host = engine.api.inspect_container(container_of(env))["HostConfig"]
        delete_all(c)
    refused = {k: v for k, v in found.items() if v.startswith("refused")}
    report(
        request,
        f"hardening: {len(refused)}/{len(found)} privileged calls refused ({found}); "
        f"/work mounted {work}; env still healthy: {still}",
    )
    assert refused == found, found
    assert {"nosuid", "nodev"} <= set(work.split(",")), work
    assert host["CapDrop"] == ["ALL"], host["CapDrop"]
    assert [c.removeprefix("CAP_") for c in host["CapAdd"]] == ["DAC_OVERRIDE"], host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"], host["SecurityOpt"]
    assert host["Memory"] == MEMORY_MB << 20 and host["PidsLimit"] == PIDS
    assert host["NanoCpus"] == 2 * 10**9  # the default
    assert still


def test_an_operator_grants_a_capability_back(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # An image whose entrypoint switches user needs SETUID: the override grants it, and only it.
    engine = docker_engine(PROBE)
    with start_server(tmp_path / "state", "--env-cap-add", "cap_setuid") as srv, api(srv) as c:
        env = probe_env(c)
        found = get(env, "/caps").json()
        found.pop("work_mount")
        host = engine.api.inspect_container(container_of(env))["HostConfig"]
        delete_all(c)
    report(request, f"hardening: with --env-cap-add cap_setuid: {found}")
    assert found.pop("setuid") == "allowed"
    assert all(v.startswith("refused") for v in found.values()), found
    assert sorted(c.removeprefix("CAP_") for c in host["CapAdd"]) == ["DAC_OVERRIDE", "SETUID"]


def test_an_unknown_capability_is_refused_before_the_server_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "denv.server", "--state-dir", str(tmp_path / "state"),
         "--env-cap-add", "SETUIDD"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "--env-cap-add SETUIDD: not a Linux capability" in done.stderr, done.stderr
    assert not (tmp_path / "state" / "denv.db").exists()


def test_state_is_private_and_holds_no_key(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    state = server.state_dir
    files = ["denv.db", "denv.db-wal", "api_key"]
    modes = {name: stat.S_IMODE(os.stat(state / name).st_mode) for name in files}
    modes["state dir"] = stat.S_IMODE(os.stat(state).st_mode)
    data = b"".join((state / n).read_bytes() for n in ("denv.db", "denv.db-wal"))
    in_db = data.count(server.key.encode())
    report(
        request,
        f"hardening: modes {', '.join(f'{k} {v:o}' for k, v in modes.items())}; "
        f"the API key in the database {in_db} times ({len(data)} bytes)",
    )
    assert modes == {"denv.db": 0o600, "denv.db-wal": 0o600, "api_key": 0o600, "state dir": 0o700}
    assert in_db == 0


def test_ingress_never_forwards_the_api_key(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    key = server.key
    accepted = [f"Bearer  {key}", f"bearer {key}", f"BEARER\t{key}", f"Bearer \t {key}"]
    refused = [f"Basic {key}", key]
    with api(server) as c:
        env = probe_env(c)
        api_codes = []
        seen = []
        with httpx.Client(trust_env=False, timeout=30) as http:
            for header in accepted + refused:
                res = http.get(f"{server.url}/v1/envs", headers={"Authorization": header})
                api_codes.append(res.status_code)
                seen.append(get(env, "/headers", headers={"Authorization": header}).json())
        own = get(env, "/headers", headers={"Authorization": "Bearer env-own-token"}).json()
        delete_all(c)
    leaked = [h for h in seen if "authorization" in h or key in json.dumps(h)]
    report(
        request,
        f"hardening: {len(accepted)} spellings of 'Bearer <key>' accepted by the API "
        f"({api_codes[: len(accepted)]}), {len(refused)} refused; through ingress "
        f"{len(leaked)} of {len(seen)} reached the env; the env's own token passed: "
        f"{own.get('authorization') == 'Bearer env-own-token'}",
    )
    assert api_codes == [200] * len(accepted) + [401] * len(refused)
    assert not leaked, leaked
    assert own.get("authorization") == "Bearer env-own-token"
