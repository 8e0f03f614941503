"""The disk budget's tables (``lifecycle/disk``, ``lifecycle/collect``): each layer's size,
recorded once, and how many of each key's versions name each layer (``owner_layers``, kept by
``Store.insert_version`` and the marks of deleted versions), so a key's disk is one indexed
read. Apart from ``db`` so that it stays one reader's worth; it runs its SQL through the
store's own ``_all``/``_run``, under the store's lock."""

from __future__ import annotations

from collections.abc import Collection

from denv.server.db_leases import Query, Statement

_CHUNK = 500  # ids per statement, within SQLite's bound on parameters


class LayerSizes:
    """``store.sizes``. Safe to call from any thread."""

    def __init__(self, query: Query, run: Statement) -> None:
        self._all = query
        self._run = run

    def get(self, layer_ids: Collection[str]) -> dict[str, int]:
        """The recorded sizes of those of ``layer_ids`` that have one."""
        out: dict[str, int] = {}
        ids = list(layer_ids)
        for i in range(0, len(ids), _CHUNK):
            chunk = tuple(ids[i : i + _CHUNK])
            marks = ",".join("?" * len(chunk))
            rows = self._all(f"SELECT id, bytes FROM layer_sizes WHERE id IN ({marks})", chunk)
            out.update((str(r[0]), int(r[1])) for r in rows)
        return out

    def record(self, sizes: dict[str, int]) -> None:
        for layer_id, size in sizes.items():
            self._run("INSERT OR REPLACE INTO layer_sizes VALUES (?, ?)", (layer_id, size))

    def forget(self, layer_ids: Collection[str]) -> None:
        for layer_id in layer_ids:
            self._run("DELETE FROM layer_sizes WHERE id=?", (layer_id,))

    def of_owner(self, owner: str) -> int:
        """Bytes of the distinct layers that ``owner``'s versions (not deleted) name."""
        rows = self._all(
            "SELECT COALESCE(SUM(s.bytes), 0) FROM owner_layers o "
            "JOIN layer_sizes s ON s.id = o.layer WHERE o.owner=?",
            (owner,),
        )
        return int(rows[0][0])
