"""How many of a live fork's children run live: those that fit on the parent's node.

Live children run in their group's container, so on the parent's node only; on a cluster
each of them counts against that node's cap (``--node-max-envs``, ``--node-max-memory``). A
fork that asks for more children than the node has room for:

* ``kind: auto`` makes as many live children as fit there, and starts the rest as a volume
  fork of the same version (the /work the live children start from) on other nodes, placed
  as live roots, each booted live (``auto``) so it forks live in turn; each of those records
  says so in ``spill`` (``Env.spill`` in the API);
* ``kind: live`` is refused (429 ``rate_limited``): it asked for copies of the running
  server, which no other node can make.

Either way a fork the whole cluster has no room for is refused before anything starts.

    live_n = live_share(ctx, rec, opts)   # opts.count: all fit; 0: a volume fork only
    note = spill_note(rec, live_n, opts.count)
"""

from __future__ import annotations

from denv.server.errors import ApiError
from denv.server.lifecycle.context import Context
from denv.server.lifecycle.live.forks import node_full
from denv.server.lifecycle.requests import EnvsCreate
from denv.server.records import EnvRecord

CLUSTER_RETRY_S = 5  # as a create the cluster has no room for (envs.Envs.create)


def live_share(ctx: Context, rec: EnvRecord, opts: EnvsCreate) -> int:
    """How many of the fork's ``opts.count`` children run live on ``rec``'s node (the rest
    spill), or the ``ApiError`` to answer."""
    group = rec.runtime.live.group if rec.runtime.live else rec.id
    room = ctx.node.room_beside(group)
    if room is None or room >= opts.count:
        return opts.count
    node = rec.runtime.node or "(unknown)"
    if opts.kind == "live":
        raise node_full(
            f"live fork of {rec.id}: node {node} has room for {room} more env(s) under its "
            f"cap and {opts.count} live children were asked for"
        )
    total = ctx.node.room()
    if total is not None and total < opts.count:
        raise ApiError(
            429,
            "rate_limited",
            f"the cluster's nodes have room for {total} more env(s) and {opts.count} were "
            "asked for: retry later, delete envs, or add nodes (denv serve "
            "--node-max-envs / --node-max-memory set each node's cap)",
            {
                "limit": "cluster",
                "room": total,
                "asked": opts.count,
                "retry_after_s": CLUSTER_RETRY_S,
            },
        )
    return max(room, 0)


def spill_note(rec: EnvRecord, live_n: int, count: int) -> str:
    """What a spilled child's record says: why it is not a live child."""
    node = rec.runtime.node or "(unknown)"
    return (
        f"node {node} of its parent {rec.id} had room for {live_n} of the fork's {count} "
        "live children: started as a volume fork (its server booted on /work as the "
        "parent's was at the fork; memory and sessions not kept)"
    )
