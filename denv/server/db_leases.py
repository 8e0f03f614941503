"""The ``leases`` table's queries (``lifecycle/leases``): a client's lease, and the envs of
the leases that ended. Apart from ``db`` so that it stays one reader's worth; it runs its SQL
through the store's own ``_all``/``_run``, under the store's lock."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from denv.server.records import LeaseRecord, LeaseState

Query = Callable[[str, tuple[Any, ...]], list[sqlite3.Row]]
Statement = Callable[[str, tuple[Any, ...]], int]


class LeaseTable:
    """``store.leases``. Safe to call from any thread."""

    def __init__(self, query: Query, run: Statement) -> None:
        self._all = query
        self._run = run

    def insert(self, lease: LeaseRecord) -> None:
        self._run("INSERT INTO leases VALUES (?,?,?,?,?,?,?)", _row(lease))

    def insert_capped(self, lease: LeaseRecord, cap: int) -> bool:
        """Insert ``lease`` unless its owner holds ``cap`` open leases already (one statement:
        two clients opening at once cannot both pass); False when refused. 0: no cap."""
        if not cap:
            self.insert(lease)
            return True
        sql = (
            "INSERT INTO leases SELECT ?,?,?,?,?,?,? WHERE (SELECT COUNT(*) FROM leases "
            "WHERE owner=? AND state='open' AND expires_at>=?) < ?"
        )
        return self._run(sql, (*_row(lease), lease.owner, lease.created_at, cap)) > 0

    def count_open(self, owner: str, at: float) -> int:
        """The owner's leases open and not past their expiry at ``at``."""
        q = "SELECT COUNT(*) FROM leases WHERE owner=? AND state='open' AND expires_at>=?"
        return int(self._all(q, (owner, at))[0][0])

    def get(self, lease_id: str) -> LeaseRecord | None:
        rows = self._all("SELECT * FROM leases WHERE id=?", (lease_id,))
        if not rows:
            return None
        r = rows[0]
        return LeaseRecord(
            id=r["id"],
            owner=r["owner"],
            timeout_s=float(r["timeout_s"]),
            expires_at=float(r["expires_at"]),
            created_at=float(r["created_at"]),
            state=r["state"],
            ended_at=r["ended_at"],
        )

    def renew(self, lease_id: str, at: float) -> bool:
        """Push an open lease's expiry to ``at`` + its timeout; False when it is not open."""
        sql = "UPDATE leases SET expires_at=?+timeout_s WHERE id=? AND state='open'"
        return self._run(sql, (at, lease_id)) > 0

    def end(self, lease_id: str, state: LeaseState, at: float) -> bool:
        """Expire or close an open lease; False when it had ended already."""
        sql = "UPDATE leases SET state=?, ended_at=? WHERE id=? AND state='open'"
        return self._run(sql, (state, at, lease_id)) > 0

    def due(self, at: float) -> list[str]:
        """Open leases whose expiry is before ``at``."""
        q = "SELECT id FROM leases WHERE state='open' AND expires_at<?"
        return [str(r[0]) for r in self._all(q, (at,))]

    def extend_open(self, at: float) -> int:
        """Give every open lease at least its timeout from ``at`` (a server start: clients
        could not renew while it was down)."""
        sql = "UPDATE leases SET expires_at=MAX(expires_at, ?+timeout_s) WHERE state='open'"
        return self._run(sql, (at,))

    def envs_of_ended(self) -> list[tuple[str, str, LeaseState, float]]:
        """(env id, lease id, lease state, when it ended) of each env not deleted whose lease
        expired or was closed."""
        q = (
            "SELECT e.id, l.id, l.state, l.ended_at FROM envs e JOIN leases l ON e.lease_id=l.id "
            "WHERE e.status!='deleted' AND l.state!='open'"
        )
        return [(r[0], r[1], r[2], float(r[3] or 0.0)) for r in self._all(q, ())]

    def forget_ended(self, before: float) -> int:
        """Drop leases that ended before ``before`` (their envs are deleted; they keep the
        lease's id in their records)."""
        return self._run("DELETE FROM leases WHERE state!='open' AND ended_at<?", (before,))

    def count_envs(self, lease_id: str) -> int:
        q = "SELECT COUNT(*) FROM envs WHERE lease_id=? AND status!='deleted'"
        return int(self._all(q, (lease_id,))[0][0])


def _row(lease: LeaseRecord) -> tuple[object, ...]:
    """The leases table's columns of ``lease``, in order."""
    return (
        lease.id,
        lease.owner,
        lease.timeout_s,
        lease.expires_at,
        lease.created_at,
        lease.state,
        lease.ended_at,
    )
