"""Limits checked outside the request models: the size of a volume that is snapshotted.

A volume's size is what the env changed in it (its overlay upper dir), counted in disk
blocks, because that is what a snapshot copies into a layer. It is checked when a snapshot
(or a fork) is asked for; writes are not stopped while the env runs.

    check_volume_sizes(ctx, env_record)   # 422 limit_exceeded past --max-volume-mb
"""

from __future__ import annotations

import os
from pathlib import Path

from .context import Context
from .envs import volume_slots
from .errors import ApiError
from .store import EnvRecord

MIB = 1024 * 1024


def disk_usage(root: Path, stop_after: int) -> int:
    """Bytes of disk the files under ``root`` use; counting stops once past ``stop_after``."""
    total = 0
    stack = [str(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:  # removed meanwhile, or not a directory
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if total > stop_after:
                    return total
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total


def check_volume_sizes(ctx: Context, env: EnvRecord) -> None:
    """422 ``limit_exceeded`` when a volume of ``env`` holds more changes than allowed."""
    limit_mb = ctx.config.max_volume_mb
    if limit_mb <= 0:
        return
    version = ctx.store.get_version(env.version_id)
    for vol, n in volume_slots(version) if version else []:
        used = disk_usage(ctx.volumes.upper(env.id, vol["service"], n), limit_mb * MIB)
        if used > limit_mb * MIB:
            raise ApiError(
                422,
                "limit_exceeded",
                f"volume {vol['path']} of service '{vol['service']}' in env {env.id} holds "
                f"more than {limit_mb} MiB of changes, the limit of a snapshot: delete files "
                "from it first (or run denv serve with a larger --max-volume-mb)",
                {"path": vol["path"], "service": vol["service"], "limit_mb": limit_mb},
            )
