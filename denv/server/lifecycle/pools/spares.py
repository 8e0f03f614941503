"""Spares: envs booted before anyone asked for them, with their volumes still to come.

A spare is booted by the node's one boot path (``Node.bring_up``, ``Node.wait_healthy``) from
a blueprint: the ``BootSpec`` of its pool with ``late_mount``, so every volume mount point is
a shared, still empty ``mnt``; mounting a child's overlay there later (``Node.mount_volumes``)
shows it inside the running containers at once. ``warm`` keeps pools of them.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import NamedTuple

from denv.server.config import WARM_BOOT_TIMEOUT_S
from denv.server.node.seam import Booted, BootSpec, Node
from denv.server.records import VersionRecord, volume_slots


@dataclass
class Spare:
    booted: Booted
    memory: int = 0  # bytes, measured once it was healthy

    @property
    def env_id(self) -> str:
        return self.booted.env_id


def blueprint(version: VersionRecord, egress: str, env: dict[str, str], owner: str) -> BootSpec:
    """What a spare of ``version`` is booted from (its ``env_id`` and pool still to fill),
    for the API key ``owner``: it boots in the key's CPU share and only the key's envs take
    it."""
    return BootSpec(
        env_id="",
        services=version.services,
        agent=version.agent_service,
        egress=egress,
        env=dict(env),
        volumes=[s.model_copy(update={"layers": []}) for s in volume_slots(version.volumes)],
        late_mount=True,
        timeout_s=WARM_BOOT_TIMEOUT_S,
        timeout_name=f"{WARM_BOOT_TIMEOUT_S:.0f}s",
        owner=owner,
    )


def pool_key(bp: BootSpec) -> str:
    """Two envs share a pool when their containers would boot alike, for the same key."""
    services = [s.model_dump(exclude={"image"}) for s in bp.services]
    volumes = [(s.service, s.n, s.path) for s in bp.volumes]
    doc = [services, volumes, bp.agent, bp.egress, sorted(bp.env.items()), bp.owner]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


class PoolOf(NamedTuple):
    """A request's warm pool, worked out once and passed along (check, take, give back, ask).

    ``key`` names the pool (``pool_key``), ``blueprint`` is what its spares boot from,
    ``warm`` says whether the version allows spares at all, and ``layers`` are the version's
    layers (on a cluster, spares on the nodes holding them are taken first).
    """

    key: str
    blueprint: BootSpec
    warm: bool
    layers: list[str]


def pool_of(version: VersionRecord, egress: str, env: dict[str, str], owner: str) -> PoolOf:
    """The pool that ``owner``'s children of ``version`` with this egress and env take
    spares from."""
    bp = blueprint(version, egress, env, owner)
    layers = list(dict.fromkeys(x for v in version.volumes for x in v.layers))
    return PoolOf(pool_key(bp), bp, version.warm_fork, layers)


def boot_spare(node: Node, bp: BootSpec, env_id: str, key: str) -> Spare:
    """Boot one spare: network, empty shared mount points, containers, a healthy agent."""
    started = time.monotonic()
    spec = bp.model_copy(update={"env_id": env_id, "warm_pool": key})
    booted = node.bring_up(spec)
    node.wait_healthy(spec, booted, WARM_BOOT_TIMEOUT_S - (time.monotonic() - started))
    return Spare(booted)
