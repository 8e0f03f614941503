"""One key flooding creates and forks: another key's create and fork stay within 2x of idle.

Key B measures the latency of a create (``POST /v1/sandboxes``, wait healthy) and of a fork
of one child, first on an idle server, then while key A floods the same server from
several processes with creates and forks as fast as it is answered (it ignores 429 and goes
again at once, the worst a client can do). The per-key caps (``fairness``, the server's
``SHARED_CAPS``) bound what A holds; B's median latency under the flood must stay within 2x of
its idle median (idle samples taken before and after the flood, so that drift during
the run hits both sides), both measured in this one run, with the caps a shared two-core server
is advised to use (``SHARED_CAPS``). Counts: 9 samples and 4 flooding processes
in CI, 15 and 16 under ``make soak``.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, start_server
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

pytestmark = pytest.mark.e2e

MAX_RATIO = 2.0
CREATE = {"image": STANDIN, "command": STANDIN_CMD}


# A shared server's caps sized for this 2-core machine, as docs/hardening.md advises: the
# defaults (8 creates in flight, 16 envs starting) are for a machine of one user, and on two
# cores a key using them slows another about 3x (measured: docs/hardening.md).
SHARED_CAPS = ("--max-creates-per-key", "1", "--max-starting-per-key", "2")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    with start_server(tmp_path_factory.mktemp("denv-flood"), *SHARED_CAPS) as srv:
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


def test_a_flooding_key_does_not_slow_another_past_2x(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    samples, threads = scale(9, 15), scale(4, 16)  # threads: flooding processes
    flooder = create_api_key(server.state_dir)
    seen: Counter[str] = Counter()
    with api(server) as b, api(server, flooder, timeout=300) as a:
        b_parent = ok(b.post("/v1/sandboxes", json=CREATE))["id"]
        a_parent = ok(a.post("/v1/sandboxes", json=CREATE))["id"]
        measure(b, b_parent, 1)  # warm the image cache and the code paths
        idle_creates, idle_forks = measure(b, b_parent, samples)
        procs = multiprocessing.get_context("spawn")
        stop, out = procs.Event(), procs.Queue()
        workers = [
            procs.Process(target=flood, args=(server.url, flooder, a_parent, CREATE, stop, out))
            for _ in range(threads)
        ]
        for w in workers:
            w.start()
        try:
            time.sleep(5)  # the flood is under way (spawned workers import first)
            flood_creates, flood_forks = measure(b, b_parent, samples)
        finally:
            stop.set()
            for _ in workers:
                seen.update(out.get(timeout=300))
            for w in workers:
                w.join(60)
        delete_all(a)
        # idle again: the baseline comes from both ends of the run, so drift hits both sides
        more_creates, more_forks = measure(b, b_parent, samples)
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
        f"flood: {threads} processes of one key sent {sum(seen.values())} creates/forks "
        f"({refused} refused 429; {dict(sorted(seen.items()))}); another key's {samples} "
        f"creates: median {statistics.median(idle_creates):.2f} s idle, "
        f"{statistics.median(flood_creates):.2f} s flooded ({ratios['create']:.2f}x); "
        f"forks: {statistics.median(idle_forks):.2f} s idle, "
        f"{statistics.median(flood_forks):.2f} s flooded ({ratios['fork']:.2f}x)",
    )
    assert refused > 0, f"the flood never reached a cap: {seen}"
    assert ratios["create"] <= MAX_RATIO and ratios["fork"] <= MAX_RATIO, ratios
    assert_nothing_left(request, server.state_dir, "flood: after", quiet=True)
