"""SQLite state (WAL): API keys, versions, envs, ingress tokens, projects, idempotency records.

One connection shared by all threads behind a lock held only for the SQL itself, never across a
Docker call. Records are those of ``records``; JSON columns hold their nested parts, converted
here and nowhere else.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from denv.server import ids
from denv.server.records import (
    LIVE,
    EnvError,
    EnvRecord,
    EnvSpec,
    EnvStatus,
    Runtime,
    ServiceSpec,
    VersionRecord,
    Volume,
)
from denv.server.tokens import ref

__all__ = ["EnvRecord", "Store", "VersionRecord", "iso", "now"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (digest TEXT PRIMARY KEY, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS versions (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, project TEXT, parent_env_id TEXT,
  agent_service TEXT NOT NULL, services TEXT NOT NULL, volumes TEXT NOT NULL,
  warm_fork INTEGER NOT NULL, labels TEXT NOT NULL, created_at TEXT NOT NULL,
  deleted INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS versions_owner ON versions (owner, id);
CREATE TABLE IF NOT EXISTS envs (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, version_id TEXT NOT NULL, parent_id TEXT,
  project TEXT, agent_service TEXT NOT NULL, egress TEXT NOT NULL, labels TEXT NOT NULL,
  status TEXT NOT NULL, start TEXT NOT NULL, created_at TEXT NOT NULL, expires_at TEXT NOT NULL,
  error TEXT, spec TEXT NOT NULL, runtime TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS envs_owner ON envs (owner, id);
CREATE INDEX IF NOT EXISTS envs_version ON envs (version_id, status);
CREATE TABLE IF NOT EXISTS ingress (
  token TEXT PRIMARY KEY, env_id TEXT NOT NULL, service TEXT NOT NULL, port INTEGER NOT NULL,
  host TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS projects (
  owner TEXT NOT NULL, name TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (owner, name));
CREATE TABLE IF NOT EXISTS idempotency (
  owner TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, status INTEGER NOT NULL,
  body TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (owner, key));
"""


def now() -> datetime:
    return datetime.now(UTC)


def iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Store:
    """The server's database. Safe to call from any thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Owner only, before SQLite writes a byte (it gives its -wal and -shm files the
        # database's mode); an older database is tightened too.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        for suffix in ("", "-wal", "-shm"):
            with suppress(FileNotFoundError):
                os.chmod(f"{path}{suffix}", 0o600)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(_SCHEMA)
            self._add_parent_version_column()
            self._add_tools_column()
            self._digest_ingress_tokens()

    def _digest_ingress_tokens(self) -> None:
        """Routes stored in clear by an older server are kept as digests from now on."""
        rows = self._db.execute("SELECT token FROM ingress WHERE token NOT LIKE 'sha256:%'")
        for (token,) in rows.fetchall():
            self._db.execute("UPDATE ingress SET token=? WHERE token=?", (ref(token), token))

    def _add_tools_column(self) -> None:
        """A database made before versions kept their MCP tools gains the column (NULL: the
        version's compose file said none, or it was not kept)."""
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(versions)")}
        if "tools" not in columns:
            self._db.execute("ALTER TABLE versions ADD COLUMN tools TEXT")

    def _add_parent_version_column(self) -> None:
        """A database made before versions knew their parent version gains the column,
        filled from the parent env of each snapshot."""
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(versions)")}
        if "parent_version_id" in columns:
            return
        self._db.execute("ALTER TABLE versions ADD COLUMN parent_version_id TEXT")
        self._db.execute(
            "UPDATE versions SET parent_version_id = "
            "(SELECT version_id FROM envs WHERE envs.id = versions.parent_env_id) "
            "WHERE parent_env_id IS NOT NULL"
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Several statements as one; keep Docker calls out of it."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

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
        self._run(
            "INSERT INTO versions (id, owner, project, parent_env_id, agent_service, services, "
            "volumes, warm_fork, labels, created_at, deleted, parent_version_id, tools) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,0,?,?)",
            (
                v.id,
                v.owner,
                v.project,
                v.parent_env_id,
                v.agent_service,
                json.dumps([x.model_dump() for x in v.services]),
                json.dumps([x.model_dump() for x in v.volumes]),
                int(v.warm_fork),
                json.dumps(v.labels),
                v.created_at,
                v.parent_version_id,
                None if v.tools is None else json.dumps(v.tools),
            ),
        )
        if v.project:
            self._run(
                "INSERT OR IGNORE INTO projects VALUES (?,?,?)", (v.owner, v.project, v.created_at)
            )

    @staticmethod
    def _version(r: sqlite3.Row) -> VersionRecord:
        return VersionRecord(
            id=r["id"],
            owner=r["owner"],
            project=r["project"],
            parent_env_id=r["parent_env_id"],
            agent_service=r["agent_service"],
            services=[ServiceSpec.model_validate(x) for x in json.loads(r["services"])],
            volumes=[Volume.model_validate(x) for x in json.loads(r["volumes"])],
            warm_fork=bool(r["warm_fork"]),
            labels=json.loads(r["labels"]),
            created_at=r["created_at"],
            deleted=bool(r["deleted"]),
            parent_version_id=r["parent_version_id"],
            tools=None if r["tools"] is None else json.loads(r["tools"]),
        )

    def get_version(self, version_id: str, include_deleted: bool = False) -> VersionRecord | None:
        sql = "SELECT * FROM versions WHERE id=?" + ("" if include_deleted else " AND deleted=0")
        rows = self._all(sql, (version_id,))
        return self._version(rows[0]) if rows else None

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
        return [self._version(r) for r in self._all(sql, tuple(args))]

    def all_versions(self) -> list[VersionRecord]:
        return [self._version(r) for r in self._all("SELECT * FROM versions WHERE deleted=0")]

    def mark_version_deleted(self, version_id: str) -> None:
        self._run("UPDATE versions SET deleted=1 WHERE id=?", (version_id,))

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
                "INSERT INTO envs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [self._env_row(e) for e in records],
            )

    @staticmethod
    def _env_row(e: EnvRecord) -> tuple[Any, ...]:
        return (
            e.id,
            e.owner,
            e.version_id,
            e.parent_id,
            e.project,
            e.agent_service,
            e.egress,
            json.dumps(e.labels),
            e.status.value,
            e.start,
            e.created_at,
            e.expires_at,
            e.error.model_dump_json() if e.error else None,
            e.spec.model_dump_json(),
            e.runtime.model_dump_json(),
        )

    @staticmethod
    def _env(r: sqlite3.Row) -> EnvRecord:
        return EnvRecord(
            id=r["id"],
            owner=r["owner"],
            version_id=r["version_id"],
            parent_id=r["parent_id"],
            project=r["project"],
            agent_service=r["agent_service"],
            egress=r["egress"],
            labels=json.loads(r["labels"]),
            status=EnvStatus(r["status"]),
            start=r["start"],
            created_at=r["created_at"],
            expires_at=r["expires_at"],
            error=EnvError.model_validate_json(r["error"]) if r["error"] else None,
            spec=EnvSpec.model_validate_json(r["spec"]),
            runtime=Runtime.model_validate_json(r["runtime"]),
        )

    def get_env(self, env_id: str) -> EnvRecord | None:
        rows = self._all("SELECT * FROM envs WHERE id=?", (env_id,))
        return self._env(rows[0]) if rows else None

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
        return [self._env(r) for r in self._all(sql, tuple(args))]

    def live_envs(self) -> list[EnvRecord]:
        return [self._env(r) for r in self._all("SELECT * FROM envs WHERE status!='deleted'")]

    def count_live(self, owner: str) -> int:
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
        only_from: Collection[EnvStatus] = LIVE,
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

    def set_start(self, env_id: str, start: str, runtime: Runtime) -> None:
        self._run(
            "UPDATE envs SET start=?, runtime=? WHERE id=?",
            (start, runtime.model_dump_json(), env_id),
        )

    def set_runtime(self, env_id: str, runtime: Runtime) -> None:
        self._run("UPDATE envs SET runtime=? WHERE id=?", (runtime.model_dump_json(), env_id))

    # ingress routes: each token kept as its digest (ingress_keys.ref), never in clear
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
