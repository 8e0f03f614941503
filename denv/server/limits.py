"""Limits checked outside the request models: the size of a volume that is snapshotted.

A volume's size is what the env changed in it (its overlay upper dir), counted in disk
blocks, because that is what a snapshot copies into a layer. It is checked when a snapshot
(or a fork) is asked for; writes are not stopped while the env runs.

    check_volume_sizes(ctx, env_record)   # 422 limit_exceeded past --max-volume-mb
"""

from __future__ import annotations

from .context import Context
from .errors import ApiError
from .records import EnvRecord, volume_slots

MIB = 1024 * 1024


def check_volume_sizes(ctx: Context, env: EnvRecord) -> None:
    """422 ``limit_exceeded`` when a volume of ``env`` holds more changes than allowed."""
    limit_mb = ctx.config.max_volume_mb
    if limit_mb <= 0:
        return
    version = ctx.store.get_version(env.version_id)
    slots = volume_slots(version.volumes) if version else []
    used = ctx.node.changed_bytes(env.id, slots, limit_mb * MIB) if slots else []
    for slot, size in zip(slots, used, strict=True):
        if size > limit_mb * MIB:
            raise ApiError(
                422,
                "limit_exceeded",
                f"volume {slot.path} of service '{slot.service}' in env {env.id} holds "
                f"more than {limit_mb} MiB of changes, the limit of a snapshot: delete files "
                "from it first (or run denv serve with a larger --max-volume-mb)",
                {"path": slot.path, "service": slot.service, "limit_mb": limit_mb},
            )
