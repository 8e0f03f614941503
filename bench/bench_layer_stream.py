"""A big layer moved node to node and through the object store, with each side's peak memory.

    sudo .venv/bin/python -m bench.bench_layer_stream [--mb 2048] [--out bench/results]
    make bench-layer-stream

Issue 27, item 6: layers move as streams, memory bounded whatever their size; target: a 2 GB
layer node to node at 150 MB/s or more, with < 100 MB of extra resident memory on either side.

Starts a local cluster of 3 nodes (``denv cluster up`` without a server: Ray nodes n0 n1 n2,
their node agents, SeaweedFS) and joins it as a Ray driver, as the control plane does. A layer
of ``--mb`` MB (random files of 64 KB to 16 MB) is made on n1 the way a snapshot publishes
one (``Volumes`` on n1's state dir). Then, through the node seam (``RemoteNode``):

- ``pack``: n1 packs it (``layer_digest``: tar + sha256, once; every move starts with it);
- ``node_to_node``: n2 copies it from n1 (``copy_layer``: n2's agent takes n1's offer over
  Ray and reads the packed layer from n1's port over TCP, hashing it into a partial file,
  then checks and unpacks it);
- ``cp_a``: beside it, ``cp -a`` of the layer dir on the same disk in this process (the
  copy a machine makes of 2 GB without any network, digest or tar: a yardstick for the
  machine's load at that moment);
- ``unpack``: that copy's last step alone (``unpack_layer`` of the same tar in this process),
  so ``node_to_node`` minus it is the stream;
- ``node_to_store``: n1 uploads it to SeaweedFS (``upload_layer``, multipart from the file);
- ``store_to_node``: n0 fetches it (``fetch_layer``: ranged GETs to a file, check, unpack).

A 1 MB layer makes the same moves first, so that each agent has loaded boto3 and its S3
client before the measures (a one-time cost, not a transfer's). For each move, the peak
resident memory (VmHWM, reset through ``/proc/PID/clear_refs`` just
before) of each agent taking part, less its resident memory before, and the same for each
node's raylet (Ray's object store, where the chunks in flight sit) and this driver. MB/s are
the packed layer's bytes over the move's time. Writes ``<out>/layer_stream.json`` and
``layer_stream.md`` with the load average. Removes everything it made. Asserts nothing.
Needs root (overlay mounts, other processes' clear_refs), as the cluster does.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from denv.cluster import local, processes, ray_cluster, seaweed
from denv.cluster.remote import RemoteNode
from denv.server.volumes.layerpack import file_digest, unpack_layer
from denv.server.volumes.object_store import LayerStore
from denv.server.volumes.overlay import Volumes

from .harness import write_json
from .measure import ROOT, conditions, machine, now_iso

log = logging.getLogger("bench.layer_stream")

MB = 1 << 20
KB = 1 << 10
TARGET_MB_S = 150.0
TARGET_EXTRA_RSS_MB = 100.0
FILE_SIZES = (64 * KB, 16 * MB)


def make_layer(vols: Volumes, total: int) -> str:
    """A layer of random files (``FILE_SIZES``) of ``total`` bytes, published on ``vols`` as a
    snapshot publishes one; its id."""
    layer_id, tmp = vols.new_layer_dir()
    rng = random.Random("denv-bench-layer-stream")
    block = os.urandom(32 * MB)
    left, n = total, 0
    while left > 0:
        size = min(left, rng.randint(*FILE_SIZES))
        sub = tmp / f"d{n // 64:03d}"
        sub.mkdir(exist_ok=True)
        start = rng.randrange(0, len(block) - size + 1)
        (sub / f"f{n:05d}").write_bytes(block[start : start + size])
        left -= size
        n += 1
    vols.publish(layer_id, tmp)
    return layer_id


def _status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM and RssShmem of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssShmem"):
            out[key] = int(rest.split()[0]) * KB
    return out


class Peaks:
    """Peak resident memory over a stretch of time, of a few processes by name."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before: dict[str, dict[str, int]] = {}

    def start(self) -> None:
        for pid in self.pids.values():
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.before = {name: _status(pid) for name, pid in self.pids.items()}

    def growth_mb(self) -> dict[str, dict[str, float]]:
        out = {}
        for name, pid in self.pids.items():
            now, was = _status(pid), self.before[name]
            out[name] = {
                "rss_before_mb": round(was["VmRSS"] / MB, 1),
                "peak_growth_mb": round((now["VmHWM"] - was["VmRSS"]) / MB, 1),
                "shmem_growth_mb": round((now["RssShmem"] - was["RssShmem"]) / MB, 1),
            }
        return out


def _raylets(state: dict[str, Any]) -> dict[str, int]:
    """Node name -> pid of its raylet (its object store lives in it)."""
    found = {}
    for node in state["nodes"]:
        for pid in processes.session_pids(int(node["sid"])):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm == "raylet":
                found[node["name"]] = pid
    return found


def _move(name: str, fn: Callable[[], object], peaks: Peaks, nbytes: int) -> dict[str, Any]:
    peaks.start()
    t0 = time.perf_counter()
    fn()
    took = time.perf_counter() - t0
    load = conditions()["loadavg"]
    result = {
        "seconds": round(took, 3),
        "mb_per_s": round(nbytes / MB / took, 1),
        "rss": peaks.growth_mb(),
        "loadavg_after": load,
    }
    log.info("%s: %s", name, result)
    return result


def measure(total_mb: int, work_root: Path | None = None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="denv-bench-layer-stream-", dir=work_root))
    cluster_dir = work / "cluster"
    before = conditions()
    layer_id = ""
    nodes: dict[str, RemoteNode] = {}
    store = None
    try:
        state = local.up(cluster_dir, nodes=3, serve=False, store=True)
        ray_cluster.connect(state["address"], Path(state["ray_token"]))
        nodes = ray_cluster.discover(local.agent_config(cluster_dir))
        store = seaweed.running(Path(state["store"]["data_dir"]))
        assert store is not None, "the cluster's SeaweedFS is not running"
        log.info("cluster up: nodes %s, store %s", sorted(nodes), store.endpoint)
        agents = {n: int(nodes[n].info()["pid"]) for n in ("n0", "n1", "n2")}
        raylets = _raylets(state)
        warm = make_layer(Volumes(cluster_dir / "nodes" / "n1"), MB)
        warm_digest = nodes["n1"].upload_layer(warm, store)
        nodes["n2"].copy_layer(warm, "n1")
        nodes["n0"].fetch_layer(warm, warm_digest, store)
        for node in nodes.values():
            node.delete_layers([warm])
        LayerStore(store).delete([warm])
        t0 = time.perf_counter()
        layer_id = make_layer(Volumes(cluster_dir / "nodes" / "n1"), total_mb * MB)
        made_s = time.perf_counter() - t0
        log.info("layer %s of %d MB made on n1 in %.1f s", layer_id, total_mb, made_s)

        def who(*names: str) -> Peaks:
            pids = {f"agent {n}": agents[n] for n in names}
            pids.update({f"raylet {n}": raylets[n] for n in names if n in raylets})
            pids["driver"] = os.getpid()
            return Peaks(pids)

        digest = ""

        def pack() -> None:
            nonlocal digest
            digest = nodes["n1"].layer_digest(layer_id)

        packed_tar = cluster_dir / "nodes" / "n1" / "packed" / f"{layer_id}.tar"
        content = total_mb * MB
        moves: dict[str, Any] = {"pack": _move("pack", pack, who("n1"), content)}
        packed = packed_tar.stat().st_size
        layer_dir = cluster_dir / "nodes" / "n1" / "layers" / layer_id
        moves["cp_a"] = _move(
            "cp_a",
            lambda: subprocess.run(["cp", "-a", str(layer_dir), str(work / "cp")], check=True),
            who(),
            content,
        )
        shutil.rmtree(work / "cp")
        moves["node_to_node"] = _move(
            "node_to_node",
            lambda: nodes["n2"].copy_layer(layer_id, "n1"),
            who("n1", "n2"),
            packed,
        )
        got = cluster_dir / "nodes" / "n2" / "packed" / f"{layer_id}.tar"
        copied_ok = file_digest(got) == digest
        t0 = time.perf_counter()
        unpack_layer(got, digest, work / "unpacked", checked=True)
        unpack_s = time.perf_counter() - t0
        shutil.rmtree(work / "unpacked")
        moves["node_to_store"] = _move(
            "node_to_store",
            lambda: nodes["n1"].upload_layer(layer_id, store),
            who("n1"),
            packed,
        )
        moves["store_to_node"] = _move(
            "store_to_node",
            lambda: nodes["n0"].fetch_layer(layer_id, digest, store),
            who("n0"),
            packed,
        )
        fetched_ok = file_digest(cluster_dir / "nodes" / "n0" / "packed" / f"{layer_id}.tar")
        n2n = moves["node_to_node"]
        stream_s = max(n2n["seconds"] - unpack_s, 1e-6)
        worst = max(
            v["peak_growth_mb"]
            for m in ("node_to_node", "node_to_store", "store_to_node")
            for k, v in moves[m]["rss"].items()
            if k.startswith("agent")
        )
        return {
            "date": now_iso(),
            "conditions": {"before": before, "after": conditions()},
            "layer": {
                "content_mb": total_mb,
                "packed_mb": round(packed / MB, 1),
                "made_s": round(made_s, 1),
                "digest": digest,
            },
            "moves": moves,
            "node_to_node_unpack_s": round(unpack_s, 3),
            "node_to_node_stream_mb_per_s": round(packed / MB / stream_s, 1),
            "node_to_node_ratio_to_cp_a": round(moves["cp_a"]["seconds"] / n2n["seconds"], 2),
            "digest_equal": {"node_to_node": copied_ok, "store_to_node": fetched_ok == digest},
            "target_mb_s": TARGET_MB_S,
            "target_extra_rss_mb": TARGET_EXTRA_RSS_MB,
            "worst_agent_peak_growth_mb": worst,
            "meets_target": n2n["mb_per_s"] >= TARGET_MB_S and worst < TARGET_EXTRA_RSS_MB,
        }
    finally:
        for node in nodes.values():
            try:
                node.delete_layers([layer_id] if layer_id else [])
            except Exception:
                log.exception("deleting the layer on %s failed", node.name)
        if store is not None and layer_id:
            LayerStore(store).delete([layer_id])
        ray_cluster.disconnect()
        local.down(cluster_dir, purge=True)
        shutil.rmtree(work, ignore_errors=True)


def table(result: dict[str, Any]) -> str:
    lay, moves = result["layer"], result["moves"]
    load = result["conditions"]
    rows = [
        f"# A {lay['content_mb']} MB layer moved as a stream ({result['date']})",
        "",
        f"`{result.get('command', 'python -m bench.bench_layer_stream')}` (as root), on a "
        "local 3-node cluster (Ray nodes on this machine, SeaweedFS on loopback).",
        "",
        f"Target: node to node >= {result['target_mb_s']:.0f} MB/s with < "
        f"{result['target_extra_rss_mb']:.0f} MB of extra resident memory on either side. "
        f"Load average before {load['before']['loadavg']}, after {load['after']['loadavg']} "
        "(2 cores, shared).",
        "",
        f"Packed layer: {lay['packed_mb']} MB (random files of 64 KB to 16 MB). MB/s are its "
        "bytes over the move's time; peak growth is VmHWM during the move less VmRSS before.",
        "",
        "| move | s | MB/s | peak RSS growth, MB (shared memory part) | load after |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    for name, m in moves.items():
        rss = "; ".join(
            f"{who} {v['peak_growth_mb']:+.1f} ({v['shmem_growth_mb']:+.1f})"
            for who, v in m["rss"].items()
        )
        rows.append(f"| {name} | {m['seconds']} | {m['mb_per_s']} | {rss} | {m['loadavg_after']} |")
    rows += [
        "",
        f"node_to_node is n2 taking n1's offer and reading the layer over TCP (1 MiB reads, "
        "sendfile on n1), checking the digest and unpacking; the unpack timed apart (in "
        f"this process, after the move) took {result['node_to_node_unpack_s']} s, so the "
        f"stream itself ran at about {result['node_to_node_stream_mb_per_s']} MB/s. Node to "
        f"node against cp -a of the same layer in the same run: "
        f"{result['node_to_node_ratio_to_cp_a']}x its speed. Digests "
        f"equal after the moves: {result['digest_equal']}. Worst agent peak growth: "
        f"{result['worst_agent_peak_growth_mb']} MB. Meets the target: "
        f"{result['meets_target']}.",
    ]
    return "\n".join(rows) + "\n"


def rewrite(out: Path) -> None:
    """``layer_stream.md`` again from ``layer_stream.json`` (after a change of the table)."""
    import json

    (out / "layer_stream.md").write_text(table(json.loads((out / "layer_stream.json").read_text())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_layer_stream")
    parser.add_argument("--mb", type=int, default=2048, help="the layer's content")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result = {
        "benchmark": "layer_stream",
        "run_id": secrets.token_hex(4),
        "machine": machine(),
        "command": f"python -m bench.bench_layer_stream --mb {args.mb}",
        **measure(args.mb),
    }
    write_json(args.out / "layer_stream.json", result)
    (args.out / "layer_stream.md").write_text(table(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
