"""Limits checked outside the request models: volume sizes at snapshot, compose services' own.

A volume's size is what the env changed in it (its overlay upper dir), counted in disk
blocks, because that is what a snapshot copies into a layer. Writes past ``--max-volume-mb``
fail inside the env (each volume's changes live on a filesystem of that size,
``volumes.filesystems``); the check at snapshot (or fork) covers a server run with that
option larger than before.

    adding = check_volume_sizes(ctx, env_record)   # 422 limit_exceeded past --max-volume-mb
    service_limits(compose_service, config.limits)   # a service's own, within the server's
"""

from __future__ import annotations

from denv.server.config import MIB
from denv.server.errors import ApiError
from denv.server.lifecycle.compose import ComposeError, ComposeService
from denv.server.lifecycle.context import Context
from denv.server.records import EnvRecord, Limits, ServiceLimits, volume_slots


def check_volume_sizes(ctx: Context, env: EnvRecord) -> int:
    """422 ``limit_exceeded`` when a volume of ``env`` holds more changes than allowed;
    else the bytes of changes its volumes hold (what a snapshot of it copies)."""
    limit_mb = ctx.config.max_volume_mb
    stop_after = limit_mb * MIB if limit_mb > 0 else 2**62
    version = ctx.store.get_version(env.version_id)
    slots = volume_slots(version.volumes) if version else []
    used = ctx.node.changed_bytes(env.id, slots, stop_after) if slots else []
    for slot, size in zip(slots, used, strict=True):
        if limit_mb > 0 and size > limit_mb * MIB:
            raise ApiError(
                422,
                "limit_exceeded",
                f"volume {slot.path} of service '{slot.service}' in env {env.id} holds "
                f"more than {limit_mb} MiB of changes, the limit of a snapshot: delete files "
                "from it first (or run denv serve with a larger --max-volume-mb)",
                {"path": slot.path, "service": slot.service, "limit_mb": limit_mb},
            )
    return sum(used)


def service_limits(svc: ComposeService, server: Limits) -> ServiceLimits | None:
    """A compose service's own limits, each within the server's (422 ``invalid_compose``).

    A service may ask for less than the server gives each container, or, where the server
    sets no limit (0), any amount; never more than the server's.
    """
    asked: dict[str, float | None] = {
        "memory_mb": svc.memory_mb,
        "pids": svc.pids,
        "cpus": svc.cpus,
    }
    if all(v is None for v in asked.values()):
        return None
    for name, value in asked.items():
        top = getattr(server, name)
        if value is not None and top > 0 and value > top:
            key, option, unit = _SERVICE_KEYS[name]
            raise ComposeError(
                f"services.{svc.name}.{key}",
                f"{value:g}{unit} is more than this server gives a container ({top:g}{unit}, "
                f"denv serve {option}): ask for at most that",
            )
    return ServiceLimits(memory_mb=svc.memory_mb, pids=svc.pids, cpus=svc.cpus)


_SERVICE_KEYS = {
    "memory_mb": ("mem_limit", "--env-memory", " MiB"),
    "pids": ("pids_limit", "--env-pids", " processes"),
    "cpus": ("cpus", "--env-cpus", " CPUs"),
}
