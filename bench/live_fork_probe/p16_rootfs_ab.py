"""Probe 16: what each live child's own root filesystem costs a fork(8), two trees side by side.

Run from the repository root (as root, with the images built):

    .venv/bin/python bench/live_fork_probe/p16_rootfs_ab.py --base DIR [--new DIR] \
        [--rounds 10] [--image denv-shapes-env:latest] [--step]

It starts one denv server per code tree (``--base``: e.g. a ``git archive`` of the commit
before live children got a root filesystem of their own; ``--new``: this checkout), each
with a live root of the image (default: the shapes env, whose steps write /workspace and
/tmp), reset and stepped 5 times, and alternates rounds between them. A round is one
``POST /envs/{id}/fork`` of 8 live children (the server answers once each child serves),
then the 8 deletes; with ``--step`` the root takes one step before each fork (its files
changed since the last fork: the node copies them again; without, it reuses its last copy).
It reads the fork's wall time, the server's phases of it (its log line: ``snapshot_ms`` is
the window in which the parent waits at its gate while the node captures and mounts, of
which ``rootfs_copy_ms`` the copy of the root's files and ``mount_ms`` the node's part),
the 8 deletes' wall time, and the root's writable layer (entries, bytes of its files).
Prints medians per tree and writes ``p16_rootfs_ab.json`` next to itself.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import start_server  # noqa: E402  (the tests' own server runner)
from denv.openenv import DenvProvider  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from bench.measure import sh  # noqa: E402
from denv import Denv  # noqa: E402

PHASES = re.compile(r"live fork (env_\w+) into (\d+): (.*), total ([\d.]+) ms")


class Tree:
    """One server of one code tree, with a stepped live root."""

    def __init__(self, stack: ExitStack, name: str, code: Path, image: str) -> None:
        self.name = name
        # The server's code: its PYTHONPATH and its working directory (``python -m`` puts
        # the working directory first on sys.path).
        os.environ["PYTHONPATH"] = f"{code}:{code / 'generated'}"
        cwd = os.getcwd()
        os.chdir(code)
        try:
            self.state = Path(tempfile.mkdtemp(prefix=f"p16-{name}-"))
            srv = stack.enter_context(start_server(self.state))
        finally:
            os.chdir(cwd)
        self.api = Denv(srv.url, srv.key)
        stack.callback(self.api.close)
        self.provider = DenvProvider(server=srv.url, api_key=srv.key, fork="live", ttl_s=3600)
        url = self.provider.start_container(image)
        self.provider.wait_for_ready(url)
        stack.callback(self.provider.stop_container)
        self.root: Any = GenericEnvClient(base_url=url, provider=self.provider).sync()
        stack.callback(self.root.close)
        self.root.reset()
        for i in range(5):
            self.root.step({"message": f"prefix {i}"})
        self.env_id = self.provider.env_id or ""
        cid = sh("docker", "ps", "-q", "--filter", f"label=denv.env={self.env_id}").split()[0]
        upper = Path(sh("docker", "inspect", "-f", "{{.GraphDriver.Data.UpperDir}}", cid).strip())
        files = [p for p in upper.rglob("*")]
        self.upper = {
            "entries": len(files),
            "bytes": sum(p.lstat().st_size for p in files if p.is_file()),
        }
        self.rows: list[dict[str, float]] = []

    def round(self, pool: ThreadPoolExecutor, step: bool) -> None:
        if step:
            self.root.step({"message": f"round {len(self.rows)}"})
        t0 = time.perf_counter()
        fork = self.api.fork(self.env_id, 8, kind="live")
        t1 = time.perf_counter()
        envs = list(fork.envs)
        assert all(str(e.status) == "healthy" for e in envs), [e.error for e in envs]
        list(pool.map(lambda e: self.api.delete_env(e.id), envs))
        t2 = time.perf_counter()
        self.rows.append({"fork8_wall_ms": (t1 - t0) * 1e3, "delete8_wall_ms": (t2 - t1) * 1e3})

    def phases(self) -> dict[str, float]:
        """Medians of the server's own phases of each fork (its log lines)."""
        log = (self.state / "server.out").read_text(errors="replace")
        rows = []
        for m in PHASES.finditer(log):
            if m.group(1) != self.env_id:
                continue
            row = {k: float(v) for k, v in (p.split() for p in m.group(3).split(", "))}
            row["total_ms"] = float(m.group(4))
            rows.append(row)
        return {k: statistics.median(r[k] for r in rows) for k in rows[0]} if rows else {}

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: statistics.median(r[k] for r in self.rows) for k in self.rows[0]}
        out["fork8_wall_ms_min_max"] = [
            min(r["fork8_wall_ms"] for r in self.rows),
            max(r["fork8_wall_ms"] for r in self.rows),
        ]
        out["server_phases_ms"] = self.phases()
        out["root_upper"] = self.upper
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--new", type=Path, default=ROOT)
    ap.add_argument("--image", default="denv-shapes-env:latest")
    ap.add_argument("--step", action="store_true", help="a step of the root before each fork")
    args = ap.parse_args()
    out: dict[str, Any] = {
        "image": args.image,
        "step": args.step,
        "loadavg_before": os.getloadavg(),
    }
    with ExitStack() as stack, ThreadPoolExecutor(8) as pool:
        trees = [
            Tree(stack, "base", args.base, args.image),
            Tree(stack, "new", args.new, args.image),
        ]
        for i in range(args.rounds):
            for tree in trees[i % 2 :] + trees[: i % 2]:
                tree.round(pool, args.step)
                time.sleep(0.3)
        out["loadavg_after"] = os.getloadavg()
        for tree in trees:
            out[tree.name] = {"code": str(args.base if tree.name == "base" else args.new)}
            out[tree.name].update(tree.summary())
            out[tree.name]["rows"] = tree.rows
    print(json.dumps({k: v for k, v in out.items()}, indent=1, default=str)[:6000])
    (HERE / "p16_rootfs_ab.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
