"""The cluster (issue 18) against one node, side by side in one run.

    .venv/bin/python -m bench.bench_cluster [--rounds 8] [--cap 4] [--out bench/results]
    .venv/bin/python -m bench.bench_cluster --isolated    # nodes that share nothing
    make bench-cluster

Local clusters (``denv.cluster.local``: Ray nodes on this machine, a node agent each,
SeaweedFS, ``denv serve --cluster``) are started one after another, each measured, then
stopped:

- ``warm fork(8)``: a stand-in env with a warm pool of 8 (``warm: 8, warm_fork: true``);
  each round rewrites one 1 MB file in its /work (so the env has 1 MB changed since its
  version: a fork's new layer is 1 MB), then forks 8 children and times the fork until all
  8 are healthy. On 1 node every spare is on the parent's node; on 3 nodes the spares spread
  over the nodes, so most children need the new 1 MB layer copied from the parent's node
  first. The issue's target: cross-node at most 50 ms slower than same-node (medians).
- ``capacity``: with ``--node-max-envs CAP``, creates one env at a time until the cluster
  answers 429: 3 nodes should accept 3x one node's envs.
- ``durable``: after a snapshot of 32 MB written to /work, the time until the version's
  ``storage`` is ``durable`` (packed, uploaded to SeaweedFS), on 3 nodes.
- ``relay step``: a WebSocket step through the ingress straight to an env against through a
  node relay in a process of its own (``bench_relay``; issue 27's target: at most 1 ms more
  at the median).

Medians, ratios and differences go to ``<out>/cluster.json`` and ``<out>/cluster.md``.
Asserts nothing. Everything it starts is stopped at the end, also on failure.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from denv.cluster import local

from . import bench_relay
from .harness import write_json
from .measure import conditions, machine

log = logging.getLogger("bench.cluster")

STANDIN = "denv-http-standin:latest"
CMD = [
    "sh",
    "-c",
    "echo seeded > /work/seed.txt; exec python3 -m http.server 8000 --directory /srv/www",
]
WARM = 8
POOL_WAIT_S = 300.0


def _client(state: dict[str, Any], cluster_dir: Path) -> httpx.Client:
    return httpx.Client(
        base_url=state["server"]["url"],
        headers={"Authorization": f"Bearer {local.api_key(cluster_dir)}"},
        timeout=600,
        trust_env=False,
    )


def _ok(res: httpx.Response, status: int = 201) -> dict[str, Any]:
    if res.status_code != status:
        raise RuntimeError(f"{res.request.method} {res.request.url}: {res.status_code} {res.text}")
    body: dict[str, Any] = res.json()
    return body


# Isolated nodes: node name -> its own Docker Engine (``docker -H``); empty otherwise.
_ENGINES: dict[str, str] = {}


def _exec(env: dict[str, Any], script: str) -> None:
    name = f"denv-{env['id'].lower()}-agent"
    host = ["-H", _ENGINES[env["node"]]] if env.get("node") in _ENGINES else []
    subprocess.run(["docker", *host, "exec", name, "sh", "-c", script], check=True, timeout=120)


def _wait_pool(c: httpx.Client, env_id: str) -> None:
    deadline = time.monotonic() + POOL_WAIT_S
    while True:
        pool = _ok(c.get(f"/v1/envs/{env_id}/warm"), 200)
        if pool["ready"] >= WARM:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"warm pool not refilled in {POOL_WAIT_S:.0f} s: {pool}")
        time.sleep(0.5)


def warm_forks(c: httpx.Client, rounds: int) -> dict[str, Any]:
    """Seconds from fork(8) to 8 healthy children, 1 MB written before each round."""
    parent = _ok(
        c.post(
            "/v1/sandboxes",
            json={"image": STANDIN, "command": CMD, "warm": WARM, "warm_fork": True, "ttl_s": 7200},
        )
    )
    took, starts, placed, cross = [], Counter[str](), Counter[str](), []
    try:
        for i in range(rounds + 1):  # round 0 warms the code paths and is not counted
            _wait_pool(c, parent["id"])
            time.sleep(2)  # let the refill's last boot settle
            # 1 MB changed since the parent's version: the same file rewritten each round
            _exec(parent, "head -c 1048576 /dev/urandom > /work/round.bin")
            started = time.monotonic()
            fork = _ok(c.post(f"/v1/envs/{parent['id']}/fork", json={"count": WARM}))
            kids = [  # the fork answers once its children are healthy; wait only for stragglers
                e
                if e["status"] == "healthy"
                else _ok(c.post(f"/v1/envs/{e['id']}/wait", json={}), 200)
                for e in fork["envs"]
            ]
            seconds = time.monotonic() - started
            bad = [k["error"] for k in kids if k["status"] != "healthy"]
            if bad:
                raise RuntimeError(f"children failed: {bad}")
            if i:
                took.append(seconds)
                starts.update(k["start"] for k in kids)
                placed.update(k["node"] for k in kids)
                cross.append(sum(k["node"] != parent["node"] for k in kids))
            for k in kids:
                c.delete(f"/v1/envs/{k['id']}")
    finally:
        c.delete(f"/v1/envs/{parent['id']}")
    return {
        "median_s": statistics.median(took),
        "runs_s": [round(x, 4) for x in took],
        "starts": dict(starts),
        "children_per_node": dict(placed),
        "cross_node_children_per_round": cross,
        "parent_node": parent["node"],
    }


def capacity(c: httpx.Client, limit: int) -> dict[str, Any]:
    """Envs created one by one until 429."""
    made: list[dict[str, Any]] = []
    refusal = ""
    try:
        for _ in range(limit):
            res = c.post("/v1/sandboxes", json={"image": STANDIN, "command": CMD})
            if res.status_code == 429:
                refusal = res.json()["message"]
                break
            made.append(_ok(res))
    finally:
        for env in made:
            c.delete(f"/v1/envs/{env['id']}")
    return {
        "accepted": len(made),
        "per_node": dict(Counter(e["node"] for e in made)),
        "refusal": refusal,
    }


def durable(c: httpx.Client, mb: int = 32) -> dict[str, Any]:
    env = _ok(c.post("/v1/sandboxes", json={"image": STANDIN, "command": CMD}))
    try:
        _exec(env, f"head -c {mb << 20} /dev/urandom > /work/big.bin")
        started = time.monotonic()
        version = _ok(c.post(f"/v1/envs/{env['id']}/snapshot", json={}))
        snapshot_s = time.monotonic() - started
        while _ok(c.get(f"/v1/versions/{version['id']}"), 200)["storage"] != "durable":
            if time.monotonic() - started > 300:
                raise RuntimeError("the version did not become durable in 300 s")
            time.sleep(0.05)
        durable_s = time.monotonic() - started
    finally:
        c.delete(f"/v1/envs/{env['id']}")
    return {
        "mb": mb,
        "snapshot_s": round(snapshot_s, 3),
        "durable_s": round(durable_s, 3),
        "upload_mb_per_s_incl_pack": round(mb / max(durable_s - snapshot_s, 1e-6), 1),
    }


def _with_cluster(root: Path, nodes: int, cap: int, fn: Any, isolated: bool = False) -> Any:
    cluster_dir = root / f"c{nodes}-cap{cap}"
    log.info("starting a local cluster of %d node(s) (cap %d, isolated %s)", nodes, cap, isolated)
    images = (STANDIN,) if isolated else ()
    state = local.up(cluster_dir, nodes=nodes, max_envs=cap, isolated=isolated, images=images)
    _ENGINES.clear()
    if isolated:
        from denv.cluster import isolation

        nodes_of = state["isolated"]["nodes"]
        _ENGINES.update({n: isolation.docker_host(node) for n, node in nodes_of.items()})
    try:
        with _client(state, cluster_dir) as c:
            return fn(c)
    finally:
        from denv.cluster import ray_cluster

        ray_cluster.disconnect()  # up() joined this cluster as a driver: leave before it stops
        local.down(cluster_dir, purge=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_cluster")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--cap", type=int, default=4, help="envs per node for the capacity run")
    parser.add_argument("--relay-steps", type=int, default=2000, help="per side, relay part")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="nodes that share nothing (denv cluster up --isolated: a namespace, a Docker "
        "Engine and a relay each); results in cluster-isolated.{json,md}",
    )
    args = parser.parse_args(argv)
    iso = args.isolated
    name = "cluster-isolated" if iso else "cluster"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    before = conditions()
    with tempfile.TemporaryDirectory(prefix="denv-bench-cluster-") as tmp:
        root = Path(tmp)
        one = _with_cluster(root, 1, 0, lambda c: warm_forks(c, args.rounds), iso)
        three = _with_cluster(root, 3, 0, lambda c: (warm_forks(c, args.rounds), durable(c)), iso)
        cap1 = _with_cluster(root, 1, args.cap, lambda c: capacity(c, 4 * args.cap), iso)
        cap3 = _with_cluster(root, 3, args.cap, lambda c: capacity(c, 4 * args.cap), iso)
    relay = bench_relay.measure(args.relay_steps)  # processes of its own: no cluster needed
    forks3, store = three
    result = {
        "machine": machine(),
        "isolated": iso,
        "conditions": {"before": before, "after": conditions()},
        "warm_fork8": {
            "one_node": one,
            "three_nodes": forks3,
            "cross_minus_same_ms": round((forks3["median_s"] - one["median_s"]) * 1000, 1),
            "target_ms": 50,
        },
        "capacity": {
            "cap_per_node": args.cap,
            "one_node": cap1,
            "three_nodes": cap3,
            "ratio": round(cap3["accepted"] / max(cap1["accepted"], 1), 2),
            "target_ratio": 3,
        },
        "durable": store,
        "relay_step": relay,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"{name}.json", result)
    wf, cp = result["warm_fork8"], result["capacity"]
    lines = [
        "# Cluster (issue 18): 3 local nodes against 1, one run"
        + (" (isolated nodes: a namespace, an engine and a relay each)" if iso else ""),
        "",
        "| measure | 1 node | 3 nodes | result |",
        "| --- | --- | --- | --- |",
        f"| warm fork(8), 1 MB new, to 8 healthy (median of {args.rounds}) | "
        f"{one['median_s'] * 1000:.0f} ms | {forks3['median_s'] * 1000:.0f} ms "
        f"(children per node {forks3['children_per_node']}) | "
        f"{wf['cross_minus_same_ms']:+.0f} ms (target <= +50) |",
        f"| envs accepted with --node-max-envs {args.cap} | {cap1['accepted']} | "
        f"{cap3['accepted']} | {cp['ratio']}x (target 3x) |",
        f"| snapshot of {store['mb']} MB to durable | | {store['durable_s']:.2f} s "
        f"(snapshot {store['snapshot_s']:.2f} s) | |",
        "",
        "A WebSocket step through the ingress straight to the env against through a node "
        "relay (bench/bench_relay.py):",
        "",
        *bench_relay.table(relay),
        "",
    ]
    (args.out / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
