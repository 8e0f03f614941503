"""The disk budget: what one API key may hold on disk, and the free disk the server keeps.

A key holds the layers its versions name (each layer's size is recorded once, when a version
first names it: ``Versions.add``) and what its envs wrote to their volumes (their overlays'
upper dirs, measured by the node when asked). A create, fork, snapshot or deploy that would
add disk asks here first, after the other checks of ``admission``:

* past ``--max-disk-per-key``: 507 ``disk_quota_exceeded``, freed by deleting envs and
  versions (``denv gc`` deletes expired ones at once);
* below ``--min-free-disk`` on the node's disk: 507 ``disk_low``, for every key, until the
  operator frees disk or the server collects expired versions.

Nothing running is touched: envs keep stepping and writing (each volume within
``--max-volume-mb``), and deletes always work, since they free disk.

    check_disk(ctx, owner, adding=changed_bytes)   # or raises the 507 to answer
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from denv.server.config import (
    DEFAULT_GC_INTERVAL_S,
    DEFAULT_MAX_DISK_PER_KEY_MB,
    DEFAULT_MIN_FREE_DISK_MB,
    DEFAULT_VERSION_GRACE_S,
    MIB,
)
from denv.server.errors import ApiError
from denv.server.lifecycle.context import Context
from denv.server.node.seam import NodeLost
from denv.server.records import EnvStatus, volume_slots

_UNITS = {"": 1, "m": 1, "g": 1024, "t": 1024 * 1024}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def disk_size(text: str) -> int:
    """``"500M"``, ``"50G"``, ``"1.5T"`` or a plain number of MiB -> MiB (argparse type)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give a number with M, G or T (MiB, GiB, TiB), e.g. "
            "500M or 50G; 0 turns it off"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _text(mib: int) -> str:
    """MiB as a person reads it: 512 MiB, 50 GiB, 1.5 GiB."""
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib} MiB"


def _bytes(n: int) -> str:
    """Bytes as a person reads them: 12.3 MiB, 1.2 GiB."""
    for unit, size in (("GiB", 1024 * MIB), ("MiB", MIB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The disk options of ``denv serve``."""
    parser.add_argument(
        "--max-disk-per-key",
        type=disk_size,
        default=DEFAULT_MAX_DISK_PER_KEY_MB,
        metavar="SIZE",
        help="disk one API key's versions (their layers) and envs (what they wrote to their "
        "volumes) may hold, e.g. 500M or 50G; past it, creates, forks, snapshots and deploys "
        "get 507 disk_quota_exceeded; 0: no limit (default "
        f"{_text(DEFAULT_MAX_DISK_PER_KEY_MB).replace(' GiB', 'G')})",
    )
    parser.add_argument(
        "--min-free-disk",
        type=disk_size,
        default=DEFAULT_MIN_FREE_DISK_MB,
        metavar="SIZE",
        help="free disk kept on the state dir's filesystem: below it, creates, forks, "
        "snapshots and deploys get 507 disk_low, running envs carry on; 0: no floor "
        f"(default {_text(DEFAULT_MIN_FREE_DISK_MB).replace(' GiB', 'G')})",
    )
    parser.add_argument(
        "--version-grace",
        type=float,
        default=DEFAULT_VERSION_GRACE_S,
        metavar="SECONDS",
        help="how long a version made by a sandbox or a fork outlives the last env and child "
        "version needing it before it is deleted; snapshots and deployed versions are kept "
        "(default %(default)g)",
    )
    parser.add_argument(
        "--gc-interval",
        type=float,
        default=DEFAULT_GC_INTERVAL_S,
        metavar="SECONDS",
        help="how often the server deletes expired versions on its own; 0: only when asked "
        "(denv gc) (default %(default)g)",
    )


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ``ServerConfig`` fields of the options above; ValueError for a negative one."""
    if args.version_grace < 0 or args.gc_interval < 0:
        raise ValueError("--version-grace and --gc-interval: give seconds, 0 or more")
    return {
        "max_disk_per_key_mb": args.max_disk_per_key,
        "min_free_disk_mb": args.min_free_disk,
        "version_grace_s": args.version_grace,
        "gc_interval_s": args.gc_interval,
    }


def volumes_bytes(ctx: Context, owner: str, stop_after: int) -> int:
    """What ``owner``'s envs (not deleted) wrote to their volumes, counted until past
    ``stop_after``."""
    total = 0
    versions: dict[str, list[Any]] = {}
    for rec in ctx.store.list_envs(owner, 10**6, None, None, None, include_deleted=False):
        if rec.status == EnvStatus.DELETED:
            continue
        if rec.version_id not in versions:
            version = ctx.store.get_version(rec.version_id, include_deleted=True)
            versions[rec.version_id] = volume_slots(version.volumes) if version else []
        slots = versions[rec.version_id]
        if slots:
            try:
                total += sum(ctx.node.changed_bytes(rec.id, slots, stop_after - total))
            except NodeLost:  # its node is gone (a cluster's dead node): so is its disk
                continue
        if total > stop_after:
            break
    return total


def key_bytes(ctx: Context, owner: str, stop_after: int = 2**62) -> int:
    """Disk ``owner`` holds: its versions' layers and its envs' volumes."""
    layers = ctx.store.sizes.of_owner(owner)
    return layers + volumes_bytes(ctx, owner, max(0, stop_after - layers))


def check_disk(ctx: Context, owner: str, adding: int = 0) -> None:
    """507 when ``adding`` more bytes for ``owner`` would pass its disk quota, or the node's
    free disk is below the server's floor."""
    floor_mb = ctx.config.min_free_disk_mb
    if floor_mb > 0:
        free = ctx.node.free_disk_bytes()
        if free - adding < floor_mb * MIB:
            raise ApiError(
                507,
                "disk_low",
                f"the server's disk has {_bytes(max(free, 0))} free, below its floor of "
                f"{_text(floor_mb)} (denv serve --min-free-disk): nothing that adds disk is "
                "created until some is freed; delete envs and versions you no longer need "
                "and run `denv gc`, or ask the operator to free disk",
                {"limit": "min_free_disk", "free_bytes": free, "min_free_bytes": floor_mb * MIB},
            )
    quota_mb = ctx.config.max_disk_per_key_mb
    if quota_mb > 0:
        used = key_bytes(ctx, owner, quota_mb * MIB)
        if used + adding > quota_mb * MIB:
            raise ApiError(
                507,
                "disk_quota_exceeded",
                f"this API key holds {_bytes(used)} of disk in versions and env volumes"
                + (f" and this request would add {_bytes(adding)}" if adding else "")
                + f", past its quota of {_text(quota_mb)} (denv serve --max-disk-per-key): "
                "delete envs and versions you no longer need (`denv versions` shows sizes), "
                "then run `denv gc` to free expired ones at once",
                {"limit": "disk_per_key", "used_bytes": used, "max_bytes": quota_mb * MIB},
            )
