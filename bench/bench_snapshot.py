"""Snapshot cost against the volume's size and against the bytes changed since the env started.

Issue 8 item 3. A snapshot copies what the env wrote (its overlay's upper dir), not the
volume. The benchmark shows it in two sweeps, writing files into `/work` through
`docker exec` on the env's container (found by its `denv.env` label):

- full writes: a base env writes S bytes (S = 10 MB .. 1 GB, cumulatively) and is
  snapshotted at each S: here everything is new, so the cost grows with S. Each snapshot
  becomes a version V_S.
- size sweep: an env started from V_S changes 1 KB and is snapshotted: the volume holds S
  bytes, the change is 1 KB.
- change sweep: on the env from the largest V_S, changes grow from 1 KB to 100 MB
  (cumulatively), snapshotted at each step.

Each point is POST /v1/envs/{id}/snapshot timed from the client, `sync` first so earlier
writes are on disk. Versions that only served a timing are deleted at once (disk space).

Run: ``python -m bench --only snapshot`` (``make bench`` runs every benchmark;
``--quick`` and ``--smoke`` are smaller profiles: bench/__main__.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .harness import Bench, summarize
from .measure import sh

log = logging.getLogger("bench.snapshot")

KB = 1024
MB = 1024 * KB
CHUNK = 64 * MB  # one file per chunk: big writes stay simple for `head`


def _container(b: Bench, env_id: str) -> str:
    ids = sh("docker", "ps", "-q", "--filter", f"label=denv.env={env_id}").split()
    if not ids:
        raise RuntimeError(f"no running container has label denv.env={env_id}")
    return ids[0]


def _write(cid: str, nbytes: int, tag: str) -> None:
    """Write `nbytes` of random data into /work/bench-<tag>-<i> inside the container."""
    done, i = 0, 0
    while done < nbytes:
        size = min(CHUNK, nbytes - done)
        path = f"/work/bench-{tag}-{i}"
        sh("docker", "exec", cid, "sh", "-c", f"head -c {size} /dev/urandom > {path}", timeout=600)
        done += size
        i += 1


def _snapshot(b: Bench, env_id: str, reps: int, keep: bool) -> tuple[list[float], str | None]:
    """Time `reps` snapshots; the id of the last version when `keep`, the rest deleted."""
    times: list[float] = []
    kept: str | None = None
    with b.denv(timeout_s=600) as api:
        for rep in range(reps):
            sh("sync")
            t0 = time.perf_counter()
            version = api.snapshot(env_id)
            times.append(time.perf_counter() - t0)
            if keep and rep == reps - 1:
                kept = version.id
            else:
                api.delete_version(version.id)
    return times, kept


def _start_env(b: Bench, version_id: str | None) -> str:
    with b.denv(detach=True) as api:  # the env outlives this client: _delete deletes it
        if version_id is None:
            env = api.create_sandbox(b.image, ports=[8000], wait="healthy", wait_timeout_s=300)
        else:
            (env,) = api.envs_from_version(version_id, wait="healthy", wait_timeout_s=300)
        return env.id


def _delete(b: Bench, env_id: str) -> None:
    with b.denv() as api:
        api.delete_env(env_id)


def run(b: Bench) -> dict[str, dict[str, Any]]:
    p = b.profile
    sizes = [int(mb * MB) for mb in p.snapshot_sizes_mb]
    changes = sorted(int(c) for c in p.snapshot_changes)
    reps = p.snapshot_reps
    full: list[dict[str, Any]] = []
    by_size: list[dict[str, Any]] = []
    by_change: list[dict[str, Any]] = []
    versions: dict[int, str] = {}

    base = _start_env(b, None)
    try:
        cid, written = _container(b, base), 0
        for size in sizes:
            _write(cid, size - written, f"base{size}")
            written = size
            times, kept = _snapshot(b, base, reps, keep=True)
            assert kept is not None
            versions[size] = kept
            full.append({"volume_bytes": size, "changed_bytes": size, **summarize(times)})
            log.info("snapshot of %d MB written: %.3fs", size // MB, min(times))
    finally:
        _delete(b, base)

    for size in sizes:
        child = _start_env(b, versions[size])
        try:
            cid = _container(b, child)
            _write(cid, changes[0], "change")
            times, _ = _snapshot(b, child, reps, keep=False)
            by_size.append({"volume_bytes": size, "changed_bytes": changes[0], **summarize(times)})
            if size == sizes[-1]:
                changed = changes[0]
                by_change.append(by_size[-1])
                for change in changes[1:]:
                    _write(cid, change - changed, f"change{change}")
                    changed = change
                    times, _ = _snapshot(b, child, reps, keep=False)
                    by_change.append(
                        {"volume_bytes": size, "changed_bytes": change, **summarize(times)}
                    )
            log.info("snapshots over a %d MB volume done", size // MB)
        finally:
            _delete(b, child)
    return {
        "snapshot": {
            "params": {
                "volume_sizes_bytes": sizes,
                "changes_bytes": changes,
                "reps": reps,
                "data": "random bytes written with `docker exec ... head -c N /dev/urandom`",
            },
            "full_write": full,
            "by_volume_size": by_size,
            "by_changed_bytes": by_change,
            "notes": [],
        }
    }
