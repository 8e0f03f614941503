"""Layer transfer over loopback: pack + upload and fetch + unpack, beside a plain ``cp -a``.

    .venv/bin/python -m bench.bench_upload [--mb 256] [--reps 3] [--out bench/results]
    python -m bench --only upload          (with the other benchmarks; --quick: 64 MB, 1 rep)

Issue 18's target: layer upload at 200 MB/s or more over loopback. A real SeaweedFS
(``denv.cluster.seaweed``) runs on 127.0.0.1; two ``DockerNode`` s on their own state dirs
stand for two nodes (no container is started: layer transfer is files and S3). Two layers
of ``--mb`` MB: ``big`` (random files of 64 KB to 16 MB) and ``small`` (random files of 4 to
28 KB, 16 KB on average: thousands of them). For each, timed ``--reps`` times (median):

- ``cp_a``: ``cp -a`` of the layer dir on the same disk (what a snapshot costs per byte);
- ``upload``: ``DockerNode.upload_layer`` from nothing packed: pack (tar + sha256) + put;
  also its parts ``pack`` and ``put`` (multipart upload of the packed file);
- ``fetch``: ``DockerNode.fetch_layer`` on the other node: get + digest check + unpack;
  also its parts ``get`` and ``unpack`` (digest check included).

MB/s are the layer's content bytes over the time, so all columns compare (the packed file
is a little bigger: tar headers). The files are in the page cache (just written) for every
column alike: the numbers are of CPU and loopback, not of the disk. Writes
``<out>/upload.json`` and ``<out>/upload.md``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import secrets
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from denv.cluster import seaweed
from denv.server.docker.engine import Engine
from denv.server.docker.node import DockerNode
from denv.server.volumes.layerpack import pack_layer, unpack_layer
from denv.server.volumes.object_store import LayerStore
from denv.server.volumes.overlay import Volumes

from .harness import Bench, write_json
from .measure import ROOT, conditions, machine, now_iso

log = logging.getLogger("bench.upload")

MB = 1 << 20
KB = 1 << 10
TARGET_UPLOAD_MB_S = 200.0
KINDS: dict[str, tuple[int, int]] = {"big": (64 * KB, 16 * MB), "small": (4 * KB, 28 * KB)}
COLUMNS = ("cp_a", "upload", "pack", "put", "fetch", "get", "unpack")


def _make_layer(path: Path, total: int, sizes: tuple[int, int], rng: random.Random) -> int:
    """Random files (random sizes in ``sizes``) of ``total`` bytes, 256 a dir; the count."""
    path.mkdir(parents=True)
    left, n = total, 0
    block = os.urandom(16 * MB)
    while left > 0:
        size = min(left, rng.randint(*sizes))
        sub = path / f"d{n // 256:04d}"
        sub.mkdir(exist_ok=True)
        start = rng.randrange(0, len(block) - size + 1)  # sizes stay <= the block's
        (sub / f"f{n:06d}").write_bytes(block[start : start + size])
        left -= size
        n += 1
    return n


def _timed(fn: Callable[..., object], *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _rm(*paths: Path) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def _measure(work: Path, kind: str, total: int, reps: int, store: Any) -> dict[str, Any]:
    rng = random.Random(f"denv-bench-upload-{kind}")
    origin = DockerNode(Engine("bench-upload-a"), Volumes(work / f"{kind}-a"))
    other = DockerNode(Engine("bench-upload-b"), Volumes(work / f"{kind}-b"))
    layer_id = f"lyr_bench{kind}{secrets.token_hex(4)}"
    layer = origin.volumes.layer_path(layer_id)
    files = _make_layer(layer, total, KINDS[kind], rng)
    subprocess.run(["sync"], check=True)
    layers = LayerStore(store)
    tar = origin.packed_dir / f"{layer_id}.tar"
    samples: dict[str, list[float]] = {c: [] for c in COLUMNS}
    packed_bytes = 0
    copy, loose = work / f"{kind}-copy", work / f"{kind}-loose.tar"
    got, dest = work / f"{kind}-got.tar", work / f"{kind}-unpacked"
    for rep in range(reps):
        samples["cp_a"].append(_timed(subprocess.run, ["cp", "-a", str(layer), str(copy)]))
        _rm(copy)

        layers.delete([layer_id])  # neither stored nor packed: upload does both
        _rm(tar, origin.packed_dir / f"{layer_id}.digest")
        samples["upload"].append(_timed(origin.upload_layer, layer_id, store))
        digest = origin.layer_digest(layer_id)
        packed_bytes = tar.stat().st_size

        samples["pack"].append(_timed(pack_layer, layer, loose))
        layers.delete([layer_id])
        samples["put"].append(_timed(layers.put, layer_id, loose, digest))

        other.delete_layers([layer_id])
        samples["fetch"].append(_timed(other.fetch_layer, layer_id, digest, store))

        samples["get"].append(_timed(layers.get, layer_id, got))
        samples["unpack"].append(_timed(unpack_layer, got, digest, dest))
        _rm(loose, got, dest)
        other.delete_layers([layer_id])
        log.info("%s rep %d: %s", kind, rep, {c: round(s[-1], 3) for c, s in samples.items()})
    layers.delete([layer_id])
    median = {c: statistics.median(s) for c, s in samples.items()}
    mb = total / MB
    return {
        "layer_mb": round(mb, 1),
        "files": files,
        "packed_mb": round(packed_bytes / MB, 1),
        "mb_per_s": {c: round(mb / t, 1) for c, t in median.items()},
        "ratio_to_cp_a": {c: round(median["cp_a"] / t, 3) for c, t in median.items()},
        "samples_s": {c: [round(v, 4) for v in s] for c, s in samples.items()},
    }


def measure(total_mb: int, reps: int, work_root: Path | None = None) -> dict[str, Any]:
    """Start SeaweedFS, measure both layer kinds, stop it; the results."""
    work = Path(tempfile.mkdtemp(prefix="denv-bench-upload-", dir=work_root))
    before = conditions()
    try:
        store = seaweed.start(work / "seaweed")
        results = {kind: _measure(work, kind, total_mb * MB, reps, store) for kind in KINDS}
    finally:
        seaweed.stop(work / "seaweed", purge=True)
        shutil.rmtree(work, ignore_errors=True)
    upload = results["big"]["mb_per_s"]["upload"]
    return {
        "date": now_iso(),
        "conditions": {"before": before, "after": conditions()},
        "reps": reps,
        "layers": results,
        "target_upload_mb_s": TARGET_UPLOAD_MB_S,
        "upload_mb_s": upload,
        "meets_target": upload >= TARGET_UPLOAD_MB_S,
    }


def run(b: Bench) -> dict[str, dict[str, Any]]:
    """``python -m bench --only upload``: the profile's layer size and reps (full: 256 MB, 3)."""
    return {"upload": measure(int(b.profile.upload_mb), int(b.profile.upload_reps))}


def table(result: dict[str, Any]) -> str:
    rows = [
        f"# layer transfer over loopback ({result['date']}, median of {result['reps']})",
        "",
        f"Target: upload >= {result['target_upload_mb_s']:.0f} MB/s; measured "
        f"{result['upload_mb_s']} MB/s (pack + upload of the big layer).",
        "",
        "| layer | files | " + " | ".join(f"{c} MB/s" for c in COLUMNS) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in COLUMNS) + " |",
    ]
    for kind, r in result["layers"].items():
        cells = " | ".join(f"{r['mb_per_s'][c]} ({r['ratio_to_cp_a'][c]}x)" for c in COLUMNS)
        rows.append(f"| {kind} {r['layer_mb']} MB | {r['files']} | {cells} |")
    rows += ["", "In brackets: the ratio to `cp -a` of the same layer (1.0 = as fast)."]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_upload")
    parser.add_argument("--mb", type=int, default=256, help="size of each layer")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result = {
        "benchmark": "upload",
        "run_id": secrets.token_hex(4),
        "machine": machine(),
        **measure(args.mb, args.reps),
    }
    write_json(args.out / "upload.json", result)
    (args.out / "upload.md").write_text(table(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
