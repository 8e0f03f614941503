"""SQLite state (WAL): API keys, versions, envs, leases, ingress tokens, projects, idempotency
records. The leases table's queries are ``db_leases``'s (``store.leases``), the layer sizes'
``db_disk``'s (``store.sizes``).

``Store`` is the queries; the file, its one connection shared by all threads behind a lock,
transactions and the watchers woken by writes are ``db_connection``'s. Records are those of
``records``; their rows are converted in ``db_rows`` and
the tables are made (and older databases upgraded) by ``db_schema``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from denv.server import ids
from denv.server.db_connection import Database
from denv.server.db_disk import LayerSizes
from denv.server.db_leases import LeaseTable
from denv.server.db_rows import env_from_row, env_row, version_from_row, version_row
from denv.server.records import (
    EXISTING,
    EnvDeletion,
    EnvError,
    EnvRecord,
    EnvStatus,
    Runtime,
    VersionRecord,
)
from denv.server.tokens import ref

__all__ = ["EnvRecord", "Store", "VersionRecord", "iso", "now"]


def _unref_layers(db: sqlite3.Connection, version_id: str) -> None:
    """A version was marked deleted (in ``db``'s transaction): its owner counts each of its
    layers once less, and no more those no other of its versions names."""
    row = db.execute("SELECT owner, volumes FROM versions WHERE id=?", (version_id,)).fetchone()
    layers = {x for vol in json.loads(row["volumes"]) for x in vol.get("layers", [])}
    db.executemany(
        "UPDATE owner_layers SET refs = refs - 1 WHERE owner=? AND layer=?",
        [(row["owner"], x) for x in layers],
    )
    db.execute("DELETE FROM owner_layers WHERE owner=? AND refs <= 0", (row["owner"],))


def now() -> datetime:
    return datetime.now(UTC)


def iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def iso_at(t: float) -> str:
    """``t`` (seconds since the epoch, as ``time.time()``) as ``iso`` writes it."""
    return iso(datetime.fromtimestamp(t, UTC))


class Store(Database):
    """The server's database. Safe to call from any thread."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        # Lease writes change no env or version: they wake no watcher (a renewal comes from
        # every client every few seconds); the deletes they cause do.
        self.leases = LeaseTable(self._all, self._run_quietly)
        self.sizes = LayerSizes(self._all, self._run_quietly)  # the disk budget's

    # meta and keys
    def instance_id(self) -> str:
        """The random id of this state dir's server; it labels every Docker object it makes."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='instance'").fetchone()
            if row:
                return str(row[0])
            value = ids.ulid().lower()
            self._db.execute("INSERT INTO meta VALUES ('instance', ?)", (value,))
            return value

    def get_meta(self, key: str) -> str | None:
        rows = self._all("SELECT value FROM meta WHERE key=?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self._run("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def add_key_digest(self, digest: str) -> None:
        self._run("INSERT OR IGNORE INTO api_keys VALUES (?, ?)", (digest, iso(now())))

    def key_digests(self) -> list[str]:
        return [str(r[0]) for r in self._all("SELECT digest FROM api_keys")]

    # versions
    def insert_version(self, v: VersionRecord) -> None:
        """Record a version, and count each layer it names for its owner's disk."""
        layers = {x for vol in v.volumes for x in vol.layers}
        with self.transaction() as db:
            db.execute(
                "INSERT INTO versions (id, owner, project, parent_env_id, agent_service, "
                "services, volumes, warm_fork, labels, created_at, deleted, parent_version_id, "
                "tools, origin, size_bytes) VALUES (?,?,?,?,?,?,?,?,?,?,0,?,?,?,?)",
                version_row(v),
            )
            db.executemany(
                "INSERT INTO owner_layers VALUES (?, ?, 1) "
                "ON CONFLICT (owner, layer) DO UPDATE SET refs = refs + 1",
                [(v.owner, x) for x in layers],
            )
        if v.project:
            self._run(
                "INSERT OR IGNORE INTO projects VALUES (?,?,?)", (v.owner, v.project, v.created_at)
            )

    def get_version(self, version_id: str, include_deleted: bool = False) -> VersionRecord | None:
        sql = "SELECT * FROM versions WHERE id=?" + ("" if include_deleted else " AND deleted=0")
        rows = self._all(sql, (version_id,))
        return version_from_row(rows[0]) if rows else None

    def list_versions(
        self, owner: str, limit: int, before: str | None, project: str | None
    ) -> list[VersionRecord]:
        sql = "SELECT * FROM versions WHERE owner=? AND deleted=0"
        args: list[Any] = [owner]
        if before:
            sql += " AND id<?"
            args.append(before)
        if project:
            sql += " AND project=?"
            args.append(project)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        return [version_from_row(r) for r in self._all(sql, tuple(args))]

    def all_versions(self) -> list[VersionRecord]:
        return [version_from_row(r) for r in self._all("SELECT * FROM versions WHERE deleted=0")]

    def mark_version_deleted(self, version_id: str) -> None:
        with self.transaction() as db:
            if db.execute(
                "UPDATE versions SET deleted=1 WHERE id=? AND deleted=0", (version_id,)
            ).rowcount:
                _unref_layers(db, version_id)

    def mark_versions_deleted_if_unused(self, version_ids: list[str]) -> list[str]:
        """Mark each of ``version_ids`` deleted unless an env not deleted or a version not
        deleted still comes from it, checked in the same statement; the ids marked."""
        done = []
        sql = (
            "UPDATE versions SET deleted=1 WHERE id=? AND deleted=0 "
            "AND NOT EXISTS (SELECT 1 FROM envs WHERE version_id=? AND status!='deleted') "
            "AND NOT EXISTS (SELECT 1 FROM versions c WHERE c.parent_version_id=? AND c.deleted=0)"
        )
        with self.transaction() as db:
            for vid in version_ids:
                if db.execute(sql, (vid, vid, vid)).rowcount:
                    _unref_layers(db, vid)
                    done.append(vid)
        return done

    def versions_in_use(self) -> set[str]:
        """Versions an env not deleted runs."""
        rows = self._all("SELECT DISTINCT version_id FROM envs WHERE status!='deleted'")
        return {str(r[0]) for r in rows}

    def version_parents(self) -> dict[str, str | None]:
        """Every version not deleted -> the version it came from (None: a root)."""
        rows = self._all("SELECT id, parent_version_id FROM versions WHERE deleted=0")
        return {str(r[0]): r[1] for r in rows}

    def seed_layers(self) -> set[str]:
        """The layers kept as images' seeds (``Versions._seed``), which new versions reuse."""
        rows = self._all("SELECT value FROM meta WHERE key LIKE 'seed:%' AND value != ''")
        return {str(r[0]) for r in rows}

    def implicit_versions(self, owner: str | None) -> list[tuple[str, str, str | None, str]]:
        """(id, owner, parent_version_id, created_at) of the versions not deleted that a
        sandbox or a fork made (of ``owner``'s, or everyone's)."""
        sql = (
            "SELECT id, owner, parent_version_id, created_at FROM versions "
            "WHERE deleted=0 AND origin IN ('sandbox','fork')"
        )
        args: tuple[Any, ...] = ()
        if owner is not None:
            sql += " AND owner=?"
            args = (owner,)
        return [(r[0], r[1], r[2], r[3]) for r in self._all(sql, args)]

    def version_in_use(self, version_id: str) -> bool:
        q = "SELECT 1 FROM envs WHERE version_id=? AND status!='deleted' LIMIT 1"
        return bool(self._all(q, (version_id,)))

    def list_projects(
        self, owner: str, limit: int, after: str | None
    ) -> list[tuple[str, str, str, int]]:
        """(name, created_at, latest_version_id, version_count), by name."""
        sql = (
            "SELECT p.name, p.created_at, MAX(v.id), COUNT(v.id) FROM projects p "
            "JOIN versions v ON v.owner=p.owner AND v.project=p.name AND v.deleted=0 "
            "WHERE p.owner=?"
        )
        args: list[Any] = [owner]
        if after:
            sql += " AND p.name>?"
            args.append(after)
        sql += " GROUP BY p.name ORDER BY p.name LIMIT ?"
        args.append(limit)
        return [(r[0], r[1], r[2], int(r[3])) for r in self._all(sql, tuple(args))]

    # envs
    def insert_env(self, e: EnvRecord) -> None:
        self.insert_envs([e])

    def insert_envs(self, records: list[EnvRecord]) -> None:
        """Insert several envs in one transaction (a fork's children)."""
        with self.transaction() as db:
            db.executemany(
                "INSERT INTO envs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [env_row(e) for e in records],
            )

    def get_env(self, env_id: str) -> EnvRecord | None:
        rows = self._all("SELECT * FROM envs WHERE id=?", (env_id,))
        return env_from_row(rows[0]) if rows else None

    def list_envs(
        self,
        owner: str,
        limit: int,
        before: str | None,
        status: EnvStatus | None,
        version_id: str | None,
        include_deleted: bool = True,
    ) -> list[EnvRecord]:
        sql = "SELECT * FROM envs WHERE owner=?"
        args: list[Any] = [owner]
        if not include_deleted and status is None:
            sql += " AND status!='deleted'"
        for col, val in (("status", status.value if status else None), ("version_id", version_id)):
            if val:
                sql += f" AND {col}=?"
                args.append(val)
        if before:
            sql += " AND id<?"
            args.append(before)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        return [env_from_row(r) for r in self._all(sql, tuple(args))]

    def existing_envs(self) -> list[EnvRecord]:
        return [env_from_row(r) for r in self._all("SELECT * FROM envs WHERE status!='deleted'")]

    def live_group(self, group: str) -> list[EnvRecord]:
        """Envs not deleted whose server runs in live group ``group`` (the container of the
        env created live): selected by SQLite, so a fork or a delete among a thousand live
        envs does not parse every env's record."""
        q = "SELECT * FROM envs WHERE status!='deleted' AND json_extract(runtime, '$.live.group')=?"
        return [env_from_row(r) for r in self._all(q, (group,))]

    def count_existing(self, owner: str) -> int:
        rows = self._all("SELECT COUNT(*) FROM envs WHERE owner=? AND status!='deleted'", (owner,))
        return int(rows[0][0])

    def count_starting(self, owner: str) -> int:
        q = "SELECT COUNT(*) FROM envs WHERE owner=? AND status IN ('creating','starting')"
        return int(self._all(q, (owner,))[0][0])

    def count_versions(self, owner: str) -> int:
        rows = self._all("SELECT COUNT(*) FROM versions WHERE owner=? AND deleted=0", (owner,))
        return int(rows[0][0])

    def expired_envs(self, at: str) -> list[str]:
        q = "SELECT id FROM envs WHERE status!='deleted' AND expires_at<?"
        return [str(r[0]) for r in self._all(q, (at,))]

    def set_status(
        self,
        env_id: str,
        status: EnvStatus,
        error: EnvError | None = None,
        only_from: Collection[EnvStatus] = EXISTING,
    ) -> bool:
        """Move an env to ``status`` unless it already left ``only_from``; True when it moved."""
        marks = ",".join("?" * len(only_from))
        sql = f"UPDATE envs SET status=?, error=? WHERE id=? AND status IN ({marks})"
        err = error.model_dump_json() if error else None
        return self._run(sql, (status.value, err, env_id, *(x.value for x in only_from))) > 0

    def adopt(
        self,
        env_id: str,
        runtime: Runtime,
        status: EnvStatus,
        routes: list[tuple[str, str, int, str]],
    ) -> bool:
        """A warm env's runtime, ingress routes (token, service, port, host) and status, at
        once; False (nothing stored) when the env left ``creating`` meanwhile."""
        with self.transaction() as db:
            moved = db.execute(
                "UPDATE envs SET status=?, runtime=? WHERE id=? AND status='creating'",
                (status.value, runtime.model_dump_json(), env_id),
            ).rowcount
            if moved:
                db.executemany(
                    "INSERT OR REPLACE INTO ingress VALUES (?,?,?,?,?)",
                    [(ref(t), env_id, svc, port, host) for t, svc, port, host in routes],
                )
        return moved > 0

    def mark_deleted(self, env_id: str, deletion: EnvDeletion) -> bool:
        """Move an env to ``deleted`` saying why, unless it was deleted already; True when
        it moved."""
        sql = "UPDATE envs SET status='deleted', deletion=? WHERE id=? AND status!='deleted'"
        return self._run(sql, (deletion.model_dump_json(), env_id)) > 0

    def set_lease(self, env_id: str, lease_id: str | None) -> None:
        self._run("UPDATE envs SET lease_id=? WHERE id=?", (lease_id, env_id))

    def set_start(self, env_id: str, start: str, runtime: Runtime) -> None:
        self._run(
            "UPDATE envs SET start=?, runtime=? WHERE id=?",
            (start, runtime.model_dump_json(), env_id),
        )

    def set_runtime(self, env_id: str, runtime: Runtime) -> None:
        self._run("UPDATE envs SET runtime=? WHERE id=?", (runtime.model_dump_json(), env_id))

    # ingress routes: each token kept as its digest (tokens.ref), never in clear
    def add_ingress(self, token: str, env_id: str, service: str, port: int, host: str) -> None:
        self._run(
            "INSERT OR REPLACE INTO ingress VALUES (?,?,?,?,?)",
            (ref(token), env_id, service, port, host),
        )

    def ingress_routes(self) -> list[tuple[str, str, str, int]]:
        """(token's ref, env_id, host, port) of every stored ingress route."""
        rows = self._all("SELECT token, env_id, host, port FROM ingress")
        return [(r[0], r[1], r[2], int(r[3])) for r in rows]

    def remove_ingress(self, env_id: str) -> list[str]:
        tokens = [
            str(r[0]) for r in self._all("SELECT token FROM ingress WHERE env_id=?", (env_id,))
        ]
        self._run("DELETE FROM ingress WHERE env_id=?", (env_id,))
        return tokens

    # idempotency
    def get_idempotent(self, owner: str, key: str) -> tuple[str, int, str] | None:
        rows = self._all(
            "SELECT fingerprint, status, body FROM idempotency WHERE owner=? AND key=?",
            (owner, key),
        )
        return (rows[0][0], int(rows[0][1]), rows[0][2]) if rows else None

    def put_idempotent(
        self, owner: str, key: str, fingerprint: str, status: int, body: str, at: float
    ) -> None:
        self._run(
            "INSERT OR REPLACE INTO idempotency VALUES (?,?,?,?,?,?)",
            (owner, key, fingerprint, status, body, at),
        )

    def expire_idempotent(self, before: float) -> None:
        self._run("DELETE FROM idempotency WHERE created_at<?", (before,))
