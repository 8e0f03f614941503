"""Load: concurrent forks, many env networks at once, and clients stepping through ingress.

- Concurrent forks (8 in CI, 32 under ``make soak``) of one stand-in env, each its own
  request, then one fork of the same count: every child healthy, distinct, and serving
  the parent's /work (a marker written before the fork comes back over HTTP).
- More envs alive at once than Docker's default address pools hold (~30 networks): each
  env network gets a distinct subnet from the server's pool.
- 8 OpenEnv clients step through ingress at once, over forked echo envs, every step a
  unique payload: 0 lost, duplicated or crossed responses.
"""

from __future__ import annotations

import ipaddress
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import LocalDenv, start_server
from reliability_helpers import (
    ECHO,
    STANDIN,
    api,
    assert_nothing_left,
    delete_all,
    ok,
    report,
    scale,
)

pytestmark = pytest.mark.e2e

SERVE_WORK = (
    "echo ok > /work/health; echo {marker} > /work/marker; "
    "exec python3 -m http.server 8000 --directory /work"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDenv]:
    state = tmp_path_factory.mktemp("denv-load")
    # The server's capacity, not fairness: no per-key caps on requests or starts in flight.
    caps = ("--max-creates-per-key", "0", "--max-starting-per-key", "0")
    with start_server(state, "--max-envs-per-key", "200", *caps) as srv:
        yield srv


def get(url: str) -> httpx.Response:
    return httpx.get(url, trust_env=False, timeout=30)


def test_concurrent_forks(server: LocalDenv, request: pytest.FixtureRequest) -> None:
    n = scale(8, 32)
    marker = uuid.uuid4().hex
    with api(server, timeout=600) as c:
        parent = ok(
            c.post(
                "/v1/sandboxes",
                json={"image": STANDIN, "command": ["sh", "-c", SERVE_WORK.format(marker=marker)]},
            )
        )
        with ThreadPoolExecutor(n) as pool:
            forks = list(
                pool.map(
                    lambda _: ok(c.post(f"/v1/envs/{parent['id']}/fork", json={"count": 1})),
                    range(n),
                )
            )
        children = [f["envs"][0] for f in forks]
        one_fork = ok(c.post(f"/v1/envs/{parent['id']}/fork", json={"count": n}))
        children += one_fork["envs"]
        assert len({f["version"]["id"] for f in forks}) == n
        assert len({e["id"] for e in children}) == 2 * n
        urls = {e["endpoints"][0]["url"] for e in children}
        assert len(urls) == 2 * n
        bad = [e["id"] for e in children if e["status"] != "healthy"]
        assert not bad, bad
        with ThreadPoolExecutor(8) as pool:
            markers = list(pool.map(lambda u: get(f"{u}/marker").text.strip(), sorted(urls)))
        wrong = sum(m != marker for m in markers)
        delete_all(c)
    report(
        request,
        f"load: {n} concurrent forks + 1 fork of {n}: {2 * n} children healthy and distinct, "
        f"{2 * n - wrong} of {2 * n} serve the parent's /work",
    )
    assert wrong == 0
    assert_nothing_left(request, server.state_dir, "load: after forks", quiet=True)


def test_more_env_networks_than_dockers_default_pools(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    n = scale(40, 100)
    with api(server, timeout=600) as c:
        body = {"image": STANDIN, "wait": "running"}
        with ThreadPoolExecutor(4) as pool:
            envs = list(pool.map(lambda _: ok(c.post("/v1/sandboxes", json=body)), range(n)))
        failed = [e["error"] for e in envs if e["status"] not in ("starting", "running", "healthy")]
        subnets = []
        for env in envs:
            out = subprocess.run(
                [
                    "docker",
                    "network",
                    "inspect",
                    f"denv-{env['id'].lower()}",
                    "--format",
                    "{{range .IPAM.Config}}{{.Subnet}}{{end}}",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            subnets.append(ipaddress.ip_network(out))
        delete_all(c)
    overlapping = sum(a.overlaps(b) for i, a in enumerate(subnets) for b in subnets[i + 1 :])
    report(
        request,
        f"load: {n} envs alive at once, {n - len(failed)} started, "
        f"{len(set(subnets))} distinct subnets, {overlapping} overlapping",
    )
    assert not failed, failed
    assert overlapping == 0 and len(set(subnets)) == n
    assert_nothing_left(request, server.state_dir, "load: after networks", quiet=True)


def test_clients_stepping_through_ingress(
    server: LocalDenv, request: pytest.FixtureRequest
) -> None:
    from openenv.core.generic_client import GenericEnvClient

    clients, steps = 8, scale(30, 500)
    with api(server, timeout=600) as c:
        root = ok(
            c.post(
                "/v1/sandboxes",
                json={"image": ECHO, "ports": [8000], "env": {"MAX_CONCURRENT_ENVS": "16"}},
            )
        )
        assert root["status"] == "healthy", root
        fork = ok(c.post(f"/v1/envs/{root['id']}/fork", json={"count": 3}))
        envs = [root, *fork["envs"]]
        bases = [e["endpoints"][0]["url"] for e in envs]

        def client(i: int) -> dict[str, Any]:
            sent, got, crossed = [], [], 0
            with GenericEnvClient(base_url=bases[i % len(bases)]).sync() as env:
                env.reset()
                for j in range(steps):
                    payload = f"client-{i}-step-{j}-{uuid.uuid4().hex}"
                    sent.append(payload)
                    echoed = env.step({"message": payload}).observation["echoed_message"]
                    got.append(echoed)
                    crossed += echoed != payload and echoed.startswith("client-")
            return {"sent": sent, "got": got, "crossed": crossed}

        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(client, range(clients)))
        delete_all(c)
    sent = [p for r in results for p in r["sent"]]
    got = [p for r in results for p in r["got"]]
    lost = len(set(sent) - set(got))
    duplicated = len(got) - len(set(got))
    crossed = sum(r["crossed"] for r in results)
    report(
        request,
        f"load: {clients} clients x {steps} steps through ingress over {len(envs)} envs: "
        f"{len(sent)} unique payloads, {lost} lost, {duplicated} duplicated, {crossed} crossed",
    )
    assert len(set(sent)) == len(sent) == clients * steps
    assert (lost, duplicated, crossed) == (0, 0, 0)
    assert all(r["sent"] == r["got"] for r in results)
    assert_nothing_left(request, server.state_dir, "load: after ingress", quiet=True)
