"""An image moved as a node moves it, with this process's peak memory for each move.

    sudo .venv/bin/python -m bench.bench_image_stream [--base denv-echo-env:latest]

Issue 27, item 4: images move between nodes and the object store as streams, never whole in
memory. Two ``NodeImages`` (``denv/server/docker/images.py``) on this machine's engine stand
for two nodes, in this one process (so its peak counts both sides). The image is ``--base``
plus a label of a random token, so removing it leaves ``--base`` and every other image
alone. Moves:

- ``node_to_node``: the origin saves it into a file and offers it (``offer``), the image is
  removed from the engine, the other node takes the offer (``copy_from``: a TCP stream into
  a file, digest checked, loaded from the file);
- ``store``: saved into a SeaweedFS this bench starts (``upload``), removed again, fetched
  (``fetch``: ranged GETs into a file, checked, loaded);
- ``docker_cli``: beside them, ``docker save | docker load`` of the same image (the CLI
  pipe, no digest, no network): the yardstick for the machine's load at that moment.

For each move, the peak resident memory (VmHWM, reset through ``/proc/self/clear_refs``)
less the resident memory before. Writes ``<out>/image_stream.json`` and ``image_stream.md``
with the load average. Removes what it made. Asserts nothing.
"""

from __future__ import annotations

import argparse
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from denv.cluster import seaweed
from denv.server.docker.images import NodeImages
from denv.server.docker.sdk import DockerApi
from denv.server.node.seam import LayerOffer

from .harness import write_json
from .measure import ROOT, conditions, machine, now_iso

MB = 1 << 20


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _measure(name: str, fn: Callable[[], object], size: int) -> dict[str, Any]:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status()
    started = time.monotonic()
    fn()
    took = time.monotonic() - started
    after = _status()
    return {
        "move": name,
        "seconds": round(took, 2),
        "mb_per_s": round(size / MB / took, 1),
        "rss_before_mb": round(before["VmRSS"] / MB, 1),
        "peak_growth_mb": round((after["VmHWM"] - before["VmRSS"]) / MB, 1),
    }


def run(base: str, out_dir: Path) -> dict[str, Any]:
    api = DockerApi("bench-image-stream")
    ref = f"denv-bench-image-{secrets.token_hex(4)}:1"
    with tempfile.TemporaryDirectory(prefix="denv-bench-image-") as tmp:
        work = Path(tmp)
        (work / "Dockerfile").write_text(f"FROM {base}\nLABEL denv.bench.image={ref}\n")
        subprocess.run(["docker", "build", "-q", "-t", ref, str(work)], check=True)
        image_id = str(api.api.inspect_image(ref)["Id"])
        origin = NodeImages(api, work / "origin")
        taker = NodeImages(api, work / "taker")
        (work / "origin").mkdir()
        (work / "taker").mkdir()
        store_dir = work / "seaweed"
        store = seaweed.start(store_dir)
        moves = []
        size = 0
        try:
            offered: list[LayerOffer] = []

            def offer() -> None:
                offered.append(origin.offer(image_id, "127.0.0.1"))

            moves.append(_measure("save_and_offer", offer, 1))
            size = offered[0].size
            moves[-1]["mb_per_s"] = round(size / MB / moves[-1]["seconds"], 1)
            api.api.remove_image(image_id, force=True)

            class Origin:
                def offer_image(self, _: str) -> LayerOffer:
                    return offered[0]

            moves.append(
                _measure("node_to_node", lambda: taker.copy_from(image_id, "o", Origin()), size)
            )
            moves.append(_measure("upload", lambda: origin.upload(image_id, store), size))
            digest = origin.upload(image_id, store)
            api.api.remove_image(image_id, force=True)
            moves.append(_measure("fetch", lambda: taker.fetch(image_id, digest, store), size))
            pipe = f"docker save {image_id} | docker load -q"
            moves.append(
                _measure("docker_cli", lambda: subprocess.run(pipe, shell=True, check=True), size)
            )
        finally:
            subprocess.run(["docker", "rmi", "-f", ref, image_id], capture_output=True)
            seaweed.stop(store_dir, purge=True)
    result: dict[str, Any] = {
        "when": now_iso(),
        "machine": machine(),
        "conditions": conditions(),
        "base": base,
        "image_mb": round(size / MB, 1),
        "moves": moves,
    }
    write_json(out_dir / "image_stream.json", result)
    lines = [
        "# Images moved as streams (bench/bench_image_stream.py)",
        "",
        f"{result['when']}; image {base} + a label ({result['image_mb']} MB saved); "
        f"load average {result['conditions'].get('loadavg')}.",
        "Both nodes are this one process: its peak counts both sides of each move.",
        "",
        "| move | s | MB/s | peak RSS growth (MB) |",
        "|---|---|---|---|",
        *(
            f"| {m['move']} | {m['seconds']} | {m['mb_per_s']} | {m['peak_growth_mb']} |"
            for m in moves
        ),
        "",
    ]
    (out_dir / "image_stream.md").write_text("\n".join(lines))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="denv-echo-env:latest")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    result = run(args.base, args.out)
    for m in result["moves"]:
        print(m)


if __name__ == "__main__":
    main()
