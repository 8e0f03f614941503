"""What the disk budget's accounting costs, in one process, no Docker.

* the walk that measures a layer once, when its first version is recorded
  (``Volumes.layer_size``), for layers of 10, 1,000 and 10,000 files;
* the per-key read every create, fork and snapshot makes (``store.sizes.of_owner``), for a
  key of 10,000 versions in fork chains (8-deep stacks), against a key of none;
* one collection's reads and selection (``Collector``) over those 10,000 versions.

Medians of ``REPEAT`` runs. ``python -m bench.bench_disk`` writes ``bench/results/disk.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from denv.server.db import Store
from denv.server.lifecycle.collect import Candidate, expired
from denv.server.records import ServiceSpec, VersionRecord, Volume
from denv.server.volumes.overlay import disk_usage

REPEAT = 5
VERSIONS = 10_000
OUT = Path(__file__).parent / "results" / "disk.json"


def median_ms(fn: Callable[[], object]) -> float:
    runs = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(runs), 2)


def main() -> None:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for files, size in ((10, 1024 * 1024), (1000, 4096), (10_000, 512)):
            layer = root / f"layer-{files}"
            for i in range(files):
                sub = layer / f"d{i // 100}"
                sub.mkdir(parents=True, exist_ok=True)
                (sub / f"f{i}").write_bytes(os.urandom(size))
            out[f"layer_size_walk_{files}_files_ms"] = median_ms(
                lambda layer=layer: disk_usage(layer, 2**62)  # type: ignore[misc]
            )
        store = Store(root / "denv.db")
        services = [ServiceSpec(name="agent", image="x", image_digest="d")]
        stack: list[str] = []
        sizes = {}
        for i in range(VERSIONS):
            layer_id = f"lyr_{i:026d}"
            stack = [layer_id, *stack][:8]
            sizes[layer_id] = 4096
            store.insert_version(
                VersionRecord(
                    id=f"ver_{i:026d}",
                    owner="busy",
                    project=None,
                    parent_env_id="env_x",
                    agent_service="agent",
                    services=services,
                    volumes=[Volume(service="agent", path="/work", layers=stack)],
                    warm_fork=False,
                    labels={},
                    created_at="2026-01-01T00:00:00Z",
                    parent_version_id=f"ver_{i - 1:026d}" if i else None,
                    origin="fork",
                )
            )
        store.sizes.record(sizes)
        out["key_layer_bytes_10000_versions_ms"] = median_ms(lambda: store.sizes.of_owner("busy"))
        out["key_layer_bytes_no_versions_ms"] = median_ms(lambda: store.sizes.of_owner("idle"))

        def collection() -> None:
            candidates = [Candidate(*row) for row in store.implicit_versions(None)]
            chosen, _ = expired(
                candidates, store.versions_in_use(), store.version_parents(), {}, 0.0, 0.0
            )
            assert len(chosen) == VERSIONS

        out["collection_select_10000_versions_ms"] = median_ms(collection)
        store.close()
    OUT.write_text(json.dumps(out, indent=2) + "\n")
    for name, value in out.items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    main()
