"""One key flooding creates and forks: another key's create and fork stay within 1.5x of idle.

Key B measures the latency of a create (``POST /v1/sandboxes``, wait healthy) and of a fork
of one child, first on an idle server, then while key A floods the same server from
several processes with creates and forks as fast as it is answered (it ignores 429 and goes
again at once, the worst a client can do), with twice as many clients as its cap on creates
in flight, so it holds every slot the caps give it. The server runs with its default caps;
what keeps B near its idle time is that each key's containers run in a CPU group of their
own, weighted by its boots in flight (one boot: 4x the default weight, eight: half of it),
and the server's queue in front of the Docker Engine serves the key with fewer calls in
flight first, has a key making more envs start no new call while B makes its one (for up
to 3 s a call), and holds it to one call in flight while B is about (docs/hardening.md,
"Fair CPU between keys"). B's median latency under the flood must stay within 1.5x of its
idle median (idle samples taken before and after the flood, so that drift during the run
hits both sides), both measured in this one run.
Counts: 9 samples of each and 4 flooding processes of 4 clients in CI, 15 and 16 under
``make soak``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, instance_id, start_server
from flood_worker import flood
from reliability_helpers import (
    STANDIN,
    STANDIN_CMD,
    api,
    assert_nothing_left,
    delete_all,
    ok,
    report,
    scale,
)

from denv.server.auth import create_api_key
from denv.server.docker import cgroups

pytestmark = pytest.mark.e2e

#: Issue 25's bound. On this 2-core machine (bench/results/flood.md), with a heavier key's
#: calls yielding at most 1 s to a lighter key's boot, B's ratios were around 1.3x and passed
#: 1.5x in one run in eighteen; with 3 s (`YIELD_MAX_S`), creates took 1.07x-1.30x and forks
#: 1.09x-1.24x in sixteen runs.
MAX_RATIO = 1.5
CREATE = {"image": STANDIN, "command": STANDIN_CMD}
CLIENTS = 4  # flooding clients per process: 4 processes hold 16, twice the creates cap


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-flood")) as srv:  # the default caps
        yield srv


def timed(fn: Any) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    body = fn()
    return time.monotonic() - started, body


def measure(c: httpx.Client, parent: str, samples: int) -> tuple[list[float], list[float]]:
    """B's create and fork latencies (seconds), deleting what each made."""
    creates, forks = [], []
    for _ in range(samples):
        took, env = timed(lambda: ok(c.post("/v1/sandboxes", json=CREATE)))
        assert env["status"] == "healthy", env
        creates.append(took)
        assert c.delete(f"/v1/envs/{env['id']}").status_code == 204
        took, fork = timed(lambda: ok(c.post(f"/v1/envs/{parent}/fork", json={"count": 1})))
        assert fork["envs"][0]["status"] == "healthy", fork
        forks.append(took)
        assert c.delete(f"/v1/envs/{fork['envs'][0]['id']}").status_code == 204
    return creates, forks


def test_a_flooding_key_does_not_slow_another_past_1_5x(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    samples, procs_n = scale(9, 15), scale(4, 16)
    before = samples // 2 + 1  # idle samples before the flood; the rest after it
    flooder = create_api_key(server.state_dir)
    seen: Counter[str] = Counter()
    with api(server) as b, api(server, flooder, timeout=300) as a:
        b_parent = ok(b.post("/v1/sandboxes", json=CREATE))["id"]
        a_parent = ok(a.post("/v1/sandboxes", json=CREATE))["id"]
        measure(b, b_parent, 1)  # warm the image cache and the code paths
        idle_creates, idle_forks = measure(b, b_parent, before)
        procs = multiprocessing.get_context("spawn")
        stop, out = procs.Event(), procs.Queue()
        args = (server.url, flooder, a_parent, CREATE, stop, out, CLIENTS)
        workers = [procs.Process(target=flood, args=args) for _ in range(procs_n)]
        for w in workers:
            w.start()
        try:
            wait_for_flood(a)
            flood_creates, flood_forks = measure(b, b_parent, samples)
        finally:
            stop.set()
            for _ in workers:
                seen.update(out.get(timeout=300))
            for w in workers:
                w.join(60)
        delete_all(a)
        # idle again: the baseline comes from both ends of the run, so drift hits both sides
        more_creates, more_forks = measure(b, b_parent, samples - before)
        idle_creates += more_creates
        idle_forks += more_forks
        delete_all(b)
    ratios = {
        "create": statistics.median(flood_creates) / statistics.median(idle_creates),
        "fork": statistics.median(flood_forks) / statistics.median(idle_forks),
    }
    refused = sum(n for k, n in seen.items() if k.endswith("429"))
    report(
        request,
        f"flood: {procs_n} processes of {CLIENTS} clients of one key sent "
        f"{sum(seen.values())} creates/forks ({refused} refused 429; "
        f"{dict(sorted(seen.items()))}); another key's {samples} "
        f"creates: median {statistics.median(idle_creates):.2f} s idle, "
        f"{statistics.median(flood_creates):.2f} s flooded ({ratios['create']:.2f}x); "
        f"forks: {statistics.median(idle_forks):.2f} s idle, "
        f"{statistics.median(flood_forks):.2f} s flooded ({ratios['fork']:.2f}x)",
    )
    assert refused > 0, f"the flood never reached a cap: {seen}"
    assert ratios["create"] <= MAX_RATIO and ratios["fork"] <= MAX_RATIO, ratios
    assert_nothing_left(request, server.state_dir, "flood: after", quiet=True)


def test_a_keys_group_weighs_more_while_its_one_env_boots(server: LocalDenv) -> None:
    """What keeps a key's one boot ahead of the host's threads serving another key's flood:
    its group's CPU weight is 4x the default while the env boots, the default once healthy."""
    root = cgroups.ROOT / "cpu"
    assert (root / "cpu.shares").exists(), "no cgroup v1 cpu hierarchy: run as root on v1"
    inst = instance_id(server.state_dir)
    seen: set[int] = set()
    done = threading.Event()

    def watch() -> None:  # the weights of this server's key groups, while the create runs
        while not done.is_set():
            for f in root.glob(f"denv-{inst}-*/cpu.shares"):
                with contextlib.suppress(OSError, ValueError):  # gone with the key's last env
                    seen.add(int(f.read_text()))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    with api(server) as b:
        keep = ok(b.post("/v1/sandboxes", json=CREATE))  # the group outlives the next env
        watcher.start()
        try:
            env = ok(b.post("/v1/sandboxes", json=CREATE))
        finally:
            done.set()
            watcher.join()
        assert env["status"] == "healthy", env
        assert cgroups.boot_shares(1) in seen, seen
        (group,) = root.glob(f"denv-{inst}-*")
        assert int((group / "cpu.shares").read_text()) == cgroups.KEY_SHARES
        for e in (env, keep):
            assert b.delete(f"/v1/envs/{e['id']}").status_code == 204


def wait_for_flood(a: httpx.Client) -> None:
    """Until the flooding key has envs starting (its workers are spawned and sending), then a
    moment more for it to fill its caps."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        envs = a.get("/v1/envs", params={"limit": 100}).json()["items"]
        if sum(e["status"] in ("creating", "starting") for e in envs) >= 4:
            break
        time.sleep(0.2)
    time.sleep(1)
