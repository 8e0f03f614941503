"""The database's tables, and the upgrades a state dir made by an older server needs.

Apart from ``db`` (the queries) because the schema changes by adding: a new column is a line
in ``SCHEMA`` for new databases and a function in ``migrate`` for old ones, and the two
belong side by side. Each upgrade checks before it changes, so running them on every start
is a no-op once done.
"""

from __future__ import annotations

import sqlite3

from denv.server.tokens import ref

SCHEMA = """
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
CREATE TABLE IF NOT EXISTS leases (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, timeout_s REAL NOT NULL, expires_at REAL NOT NULL,
  created_at REAL NOT NULL, state TEXT NOT NULL, ended_at REAL);
CREATE INDEX IF NOT EXISTS leases_due ON leases (state, expires_at);
CREATE TABLE IF NOT EXISTS layer_sizes (id TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS owner_layers (
  owner TEXT NOT NULL, layer TEXT NOT NULL, refs INTEGER NOT NULL, PRIMARY KEY (owner, layer));
CREATE TABLE IF NOT EXISTS idempotency (
  owner TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, status INTEGER NOT NULL,
  body TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (owner, key));
"""


def create_and_migrate(db: sqlite3.Connection) -> None:
    """Make any missing table, then upgrade an older database in place."""
    db.executescript(SCHEMA)
    _add_parent_version_column(db)
    _add_tools_column(db)
    _digest_ingress_tokens(db)
    _add_lease_columns(db)
    _add_version_origin_columns(db)
    _count_owner_layers(db)


def _count_owner_layers(db: sqlite3.Connection) -> None:
    """A database made before the disk budget gains, for each key, how many of its versions
    name each layer (``owner_layers``, kept by ``Store`` from then on)."""
    if db.execute("SELECT 1 FROM owner_layers LIMIT 1").fetchone():
        return
    db.execute(
        "INSERT INTO owner_layers SELECT owner, layer, COUNT(*) FROM ("
        "SELECT DISTINCT v.id, v.owner, l.value AS layer FROM versions v, "
        "json_each(v.volumes) vol, json_each(vol.value, '$.layers') l WHERE v.deleted=0) "
        "GROUP BY owner, layer"
    )


def _add_version_origin_columns(db: sqlite3.Connection) -> None:
    """A database made before versions expired gains what made each and its size (0:
    unknown). Versions without a parent env were deployed (with a project) or came from a
    sandbox (without); the rest read as snapshots (kept), since a fork's version cannot be
    told from one."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(versions)")}
    if "origin" in columns:
        return
    db.execute("ALTER TABLE versions ADD COLUMN origin TEXT NOT NULL DEFAULT 'snapshot'")
    db.execute("ALTER TABLE versions ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0")
    db.execute(
        "UPDATE versions SET origin='deploy' WHERE project IS NOT NULL AND parent_env_id IS NULL"
    )
    db.execute(
        "UPDATE versions SET origin='sandbox' WHERE project IS NULL AND parent_env_id IS NULL"
    )


def _add_lease_columns(db: sqlite3.Connection) -> None:
    """A database made before leases gains each env's lease and why it was deleted (NULL:
    detached, and not said)."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(envs)")}
    if "lease_id" not in columns:
        db.execute("ALTER TABLE envs ADD COLUMN lease_id TEXT")
    if "deletion" not in columns:
        db.execute("ALTER TABLE envs ADD COLUMN deletion TEXT")
    db.execute("CREATE INDEX IF NOT EXISTS envs_lease ON envs (lease_id, status)")


def _digest_ingress_tokens(db: sqlite3.Connection) -> None:
    """Routes stored in clear by an older server are kept as digests from now on."""
    rows = db.execute("SELECT token FROM ingress WHERE token NOT LIKE 'sha256:%'")
    for (token,) in rows.fetchall():
        db.execute("UPDATE ingress SET token=? WHERE token=?", (ref(token), token))


def _add_tools_column(db: sqlite3.Connection) -> None:
    """A database made before versions kept their MCP tools gains the column (NULL: the
    version's compose file said none, or it was not kept)."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(versions)")}
    if "tools" not in columns:
        db.execute("ALTER TABLE versions ADD COLUMN tools TEXT")


def _add_parent_version_column(db: sqlite3.Connection) -> None:
    """A database made before versions knew their parent version gains the column,
    filled from the parent env of each snapshot."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(versions)")}
    if "parent_version_id" in columns:
        return
    db.execute("ALTER TABLE versions ADD COLUMN parent_version_id TEXT")
    db.execute(
        "UPDATE versions SET parent_version_id = "
        "(SELECT version_id FROM envs WHERE envs.id = versions.parent_env_id) "
        "WHERE parent_env_id IS NOT NULL"
    )
