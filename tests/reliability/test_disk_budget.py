"""The disk budget holds: a key that forks and writes in a loop is stopped at its quota with
507 ``disk_quota_exceeded``, another key is not, running envs carry on, and once the key's
envs are deleted ``denv gc`` frees its fork versions' layers, so the server's layers and
volumes are back to where they started. The same server restarted with a free-disk floor
above the disk's free space refuses creates with 507 ``disk_low``, while the env it already
ran keeps serving.

One test, one state dir, two server starts (a start costs seconds on a busy machine): a
tight quota, no grace and no background collection, so ``denv gc`` reports exactly what it
freed; the other key's env outlives the first server into the second.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import clean, docker_engine, start_server
from reliability_helpers import STANDIN, STANDIN_CMD, api, container_of, ok, report

from bench.soak_checks import usage
from denv.cli import main
from denv.server.auth import create_api_key

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
QUOTA_MB = 40
WRITE_MB = 10  # what each env of the loop writes to /work before it is forked
BUDGET = ["--max-disk-per-key", f"{QUOTA_MB}M", "--version-grace", "0", "--gc-interval", "0"]


def held(state: Path, but: str = "") -> int:
    """What versions and envs hold in the state dir (layers, packed layers and volumes), but
    the volumes of env ``but``."""
    envs = usage(state / "envs") - (usage(state / "envs" / but) if but else 0)
    return usage(state / "layers") + usage(state / "packed") + envs


def sandbox(c: httpx.Client) -> dict[str, Any]:
    body = {"image": STANDIN, "command": STANDIN_CMD, "live": False}
    return ok(c.post("/v1/sandboxes", json=body))


def write(env: dict[str, Any], mb: int, name: str) -> None:
    done = subprocess.run(
        ["docker", "exec", container_of(env), "sh", "-c",
         f"head -c {mb * MIB} /dev/urandom > /work/{name} && sync"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def deleted(res: httpx.Response) -> None:
    assert res.status_code == 204, (res.request.url, res.text)


def serves(env: dict[str, Any]) -> bool:
    res = httpx.get(f"{env['endpoints'][0]['url']}/health", trust_env=False, timeout=30)
    return res.status_code == 200


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    docker_engine(STANDIN)
    yield tmp_path / "state"
    clean(tmp_path / "state")


class Laps:
    """Seconds each phase took, for the summary line (never asserted)."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.laps: list[str] = []

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.laps.append(f"{name} {now - self.t:.1f}s")
        self.t = now


def test_the_disk_budget_holds_and_gc_gives_the_disk_back(
    state: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lap = Laps()
    with start_server(state, *BUDGET, cleanup=False) as srv, api(srv) as c:
        lap("start")
        start = held(state)
        env = sandbox(c)
        forks: list[dict[str, Any]] = []
        refused: httpx.Response | None = None
        for i in range(8):  # each round: write, fork the writer, drop the writer
            write(env, WRITE_MB, f"round-{i}")
            res = c.post(f"/v1/envs/{env['id']}/fork", json={"count": 1, "kind": "volume"})
            if res.status_code != 201:
                refused = res
                break
            fork = res.json()
            forks.append(fork["version"])
            deleted(c.delete(f"/v1/envs/{env['id']}"))
            env = fork["envs"][0]
        lap("loop")
        assert refused is not None, "the loop never reached the quota"
        error = refused.json()
        assert refused.status_code == 507 and error["code"] == "disk_quota_exceeded", error
        assert "--max-disk-per-key" in error["message"] and "denv gc" in error["message"]
        assert error["details"]["max_bytes"] == QUOTA_MB * MIB
        assert len(forks) >= 2, forks  # a few rounds fit in the quota, each adds a layer
        peak = held(state)

        # the env that was refused still serves and writes; it cannot be snapshotted either
        assert serves(env)
        write(env, 1, "after-refusal")
        snap = c.post(f"/v1/envs/{env['id']}/snapshot", json={})
        assert snap.status_code == 507 and snap.json()["code"] == "disk_quota_exceeded"

        # versions say what they hold: each fork version about one round's write
        listed = {v["id"]: v for v in ok(c.get("/v1/versions"), 200)["items"]}
        for v in forks:
            seen = listed[v["id"]]
            assert seen["implicit"] is True
            assert WRITE_MB * MIB <= seen["size_bytes"] < (WRITE_MB + 1) * MIB, seen

        # another key creates and snapshots as before; its env stays for the second server
        other = create_api_key(state)
        with api(srv, other) as o:
            theirs = sandbox(o)
            kept = ok(o.post(f"/v1/envs/{theirs['id']}/snapshot", json={}))
            assert kept["implicit"] is False
            deleted(o.delete(f"/v1/versions/{kept['id']}"))

        # `denv versions` shows them with their sizes, marked as expiring
        monkeypatch.setenv("DENV_SERVER", srv.url)
        monkeypatch.setenv("DENV_API_KEY", srv.key)
        capsys.readouterr()
        assert main(["versions"]) == 0
        table = capsys.readouterr().out
        assert "SIZE" in table and f"{WRITE_MB}.0 MiB *" in table, table

        lap("checks")
        # cleanup: delete the key's envs; denv gc frees every version the loop made
        deleted(c.delete(f"/v1/envs/{env['id']}"))
        assert main(["gc", "--json"]) == 0
        freed = json.loads(capsys.readouterr().out)
        assert freed["versions_deleted"] == len(forks) + 1  # the forks and the sandbox's
        assert freed["bytes_freed"] >= len(forks) * WRITE_MB * MIB, freed
        assert ok(c.get("/v1/versions"), 200)["items"] == []
        end = held(state, but=theirs["id"])
        lap("gc")
    lap("stop")
    assert end <= start, (start, peak, end)

    # the floor: 100 GiB above what is free; the other key's env carries on
    st = os.statvfs(state)
    free_mb = st.f_bavail * st.f_frsize // MIB
    floor = ["--min-free-disk", f"{free_mb + 100 * 1024}M"]
    with start_server(state, *BUDGET, *floor, cleanup=False) as srv, api(srv, other) as o:
        lap("restart")
        res = o.post("/v1/sandboxes", json={"image": STANDIN, "command": STANDIN_CMD})
        low = res.json()
        assert res.status_code == 507 and low["code"] == "disk_low", low
        assert "--min-free-disk" in low["message"] and low["details"]["limit"] == "min_free_disk"
        fork = o.post(f"/v1/envs/{theirs['id']}/fork", json={"count": 1, "kind": "volume"})
        assert fork.status_code == 507 and fork.json()["code"] == "disk_low"
        theirs = ok(o.get(f"/v1/envs/{theirs['id']}"), 200)  # its URL names the new port
        assert theirs["status"] == "healthy"
        assert serves(theirs)
        write(theirs, 1, "below-the-floor")
        deleted(o.delete(f"/v1/envs/{theirs['id']}"))
        lap("floor")
    lap("stop")
    report(
        request,
        f"disk budget: {len(forks)} forks of {WRITE_MB} MiB fit in {QUOTA_MB} MiB, the next "
        f"was 507; gc freed {freed['versions_deleted']} versions, "
        f"{freed['bytes_freed'] / MIB:.1f} MiB; layers+volumes {start} -> {peak} -> {end} "
        f"bytes; a floor above {free_mb} MiB free: 507 disk_low, the running env served; "
        + ", ".join(lap.laps),
    )
