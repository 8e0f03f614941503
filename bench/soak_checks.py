"""What the long soak (bench/soak_long.py) reads off a server's state dir: envs not deleted,
versions the expiry policy should have collected, layers no version names, the disk the
state dir holds, what the instance left on the machine, and the server's memory.

Read-only, from the outside (the database with sqlite3, /proc, ``docker``), so the soak
checks the server without trusting its own answers.

Not run on its own: bench/soak_long.py imports it (and
tests/reliability/test_disk_budget.py).
"""

from __future__ import annotations

import json
import os
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

from .measure import sh


def _db(state_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{state_dir / 'denv.db'}?mode=ro", uri=True, timeout=30)


def _live(state_dir: Path) -> list[tuple[str, str, str]]:
    with _db(state_dir) as con:
        rows = con.execute("SELECT id, owner, status FROM envs WHERE status != 'deleted'")
        return [(str(a), str(b), str(c)) for a, b, c in rows.fetchall()]


def live_envs(state_dir: Path) -> list[tuple[str, str, str]]:
    """(id, owner, status) of the envs not deleted, zygotes (owner ``zygote:<key>``: never
    handed out, reaped when idle or at server exit) aside."""
    return [r for r in _live(state_dir) if not r[1].startswith("zygote:")]


def zygotes(state_dir: Path) -> int:
    """Zygotes not deleted."""
    return sum(r[1].startswith("zygote:") for r in _live(state_dir))


def env_counts(state_dir: Path) -> dict[str, int]:
    """Envs ever recorded, by how they started (boot, zygote, live) and by deletion reason."""
    with _db(state_dir) as con:
        rows = con.execute(
            "SELECT start, deletion FROM envs WHERE owner NOT LIKE 'zygote:%'"
        ).fetchall()
    counts: dict[str, int] = {"envs": len(rows)}
    for start, deletion in rows:
        counts[f"start:{start}"] = counts.get(f"start:{start}", 0) + 1
        reason = json.loads(deletion)["reason"] if deletion else "none"
        counts[f"deleted:{reason}"] = counts.get(f"deleted:{reason}", 0) + 1
    return counts


def deletions(state_dir: Path, env_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Env id -> its status and deletion record (reason, message, at)."""
    if not env_ids:
        return {}
    marks = ",".join("?" * len(env_ids))
    with _db(state_dir) as con:
        rows = con.execute(
            f"SELECT id, status, deletion FROM envs WHERE id IN ({marks})", env_ids
        ).fetchall()
    return {str(i): {"status": s, **(json.loads(d) if d else {})} for i, s, d in rows}


def seconds_between(wall_s: float, iso: str) -> float:
    """Seconds from a ``time.time()`` to an ISO time the server wrote."""
    return datetime.fromisoformat(iso).timestamp() - wall_s


def versions_beyond_policy(state_dir: Path) -> list[str]:
    """Versions a sandbox or a fork made that nothing needs any more (no env not deleted runs
    one, no version not deleted names it as parent), yet not deleted. Once the grace period
    and a collection have passed since the last env went, the policy leaves none."""
    with _db(state_dir) as con:
        implicit = con.execute(
            "SELECT id FROM versions WHERE deleted=0 AND origin IN ('sandbox','fork')"
        ).fetchall()
        used = con.execute(
            "SELECT DISTINCT version_id FROM envs WHERE status != 'deleted'"
        ).fetchall()
        parents = con.execute(
            "SELECT DISTINCT parent_version_id FROM versions WHERE deleted=0"
        ).fetchall()
    needed = {r[0] for r in used} | {r[0] for r in parents if r[0]}
    return sorted(str(r[0]) for r in implicit if r[0] not in needed)


def version_counts(state_dir: Path) -> dict[str, int]:
    """Versions ever recorded and those not deleted, by origin."""
    with _db(state_dir) as con:
        rows = con.execute("SELECT origin, deleted FROM versions").fetchall()
    counts: dict[str, int] = {"versions": len(rows)}
    for origin, deleted in rows:
        key = f"{origin}:{'deleted' if deleted else 'kept'}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def unreferenced_layers(state_dir: Path) -> list[str]:
    """Layer dirs no version not deleted names (image seeds kept on purpose excepted), and
    half-made ones."""
    with _db(state_dir) as con:
        rows = con.execute("SELECT volumes FROM versions WHERE deleted = 0").fetchall()
        seeds = con.execute("SELECT value FROM meta WHERE key LIKE 'seed:%'").fetchall()
    named = {x for (vols,) in rows for vol in json.loads(vols) for x in vol["layers"]}
    named |= {str(s[0]) for s in seeds}
    layers = state_dir / "layers"
    if not layers.is_dir():
        return []
    return sorted(
        p.name
        for p in layers.iterdir()
        if (p.name.startswith("lyr_") and p.name not in named) or p.name.startswith(".")
    )


def usage(path: Path) -> int:
    """Bytes of disk ``path`` and the files under it use (0: it does not exist)."""
    if not path.exists():
        return 0
    total = path.lstat().st_blocks * 512
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def disk(state_dir: Path) -> dict[str, int]:
    """Bytes the state dir holds in layers, packed layers and env dirs (volumes), and their
    sum."""
    parts = {name: usage(state_dir / name) for name in ("layers", "packed", "envs")}
    return {**parts, "total": sum(parts.values())}


def rss_kib(pid: int) -> int | None:
    """A process's resident memory (VmRSS), in KiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def instance_id(state_dir: Path) -> str | None:
    with _db(state_dir) as con:
        row = con.execute("SELECT value FROM meta WHERE key='instance'").fetchone()
    return str(row[0]) if row else None


def machine_leftovers(state_dir: Path) -> dict[str, list[str]]:
    """Containers, networks, Docker volumes, cgroups, mounts and loop devices of the state
    dir's server instance that still exist (after the server stopped: all are leftovers)."""
    inst = instance_id(state_dir)
    found: dict[str, list[str]] = {}
    label = f"label=denv.instance={inst}"
    for kind, cmd in (
        ("containers", ("ps", "-aq")),
        ("networks", ("network", "ls", "-q")),
        ("volumes", ("volume", "ls", "-q")),
    ):
        found[kind] = sh("docker", *cmd, "--filter", label, check=False).split()
    found["cgroups"] = sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/denv-{inst}-*"))
    root = str(state_dir.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        found["mounts"] = [ln.split()[4] for ln in f if ln.split()[4].startswith(root)]
    found["loop_devices"] = [
        b.parent.parent.name
        for b in Path("/sys/block").glob("loop*/loop/backing_file")
        if b.read_text().strip().startswith(root)
    ]
    return found


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x; None for fewer than 3 points or one x."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def stale_live_cgroups(state_dir: Path) -> list[str]:
    """Cgroups of live envs (``<container>/denv-live/<env>``, docker/live/cgroups.py) whose env
    is deleted, in containers that still run: each should go with its env."""
    inst = instance_id(state_dir)
    found = Path("/sys/fs/cgroup").glob(f"*/denv-{inst}-*/*/denv-live/env_*")
    by_env: dict[str, list[str]] = {}
    for path in found:
        by_env.setdefault(path.name, []).append(str(path))
    if not by_env:
        return []
    alive = {r[0] for r in _live(state_dir)}
    return sorted(p for env_id, paths in by_env.items() if env_id not in alive for p in paths)
