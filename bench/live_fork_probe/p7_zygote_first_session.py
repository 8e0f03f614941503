"""What a zygote's copy does in its first session that a second session does not: timings
and the modules the copy imported after it was copied (launcher ``hello``), against the
zygote's. Run from the repository root as root (it reads /proc of the env's processes):
`.venv/bin/python bench/live_fork_probe/p7_zygote_first_session.py`.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import start_server  # noqa: E402
from denv.openenv import DenvProvider  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from denv.server.docker.live import launcher_ctl as live  # noqa: E402

IMAGE = "denv-echo-env:latest"


def _proc(state: Path, where: str) -> live.Proc | None:
    with sqlite3.connect(state / "denv.db") as con:
        rows = con.execute(f"SELECT runtime FROM envs WHERE {where}").fetchall()
    for (raw,) in rows:
        lv = json.loads(raw).get("live")
        if lv:
            return live.Proc(int(lv["pid"]), int(lv["start"]))
    return None


def main() -> None:
    parent = Path(tempfile.mkdtemp(prefix="denv-p7-"))
    state = parent / "state"
    with start_server(state, "--zygotes") as srv:
        first = DenvProvider(server=srv.url, api_key=srv.key)
        root: Any = GenericEnvClient.from_docker_image(IMAGE, provider=first).sync()
        root.reset()
        q = "owner LIKE 'zygote:%' AND status='healthy'"
        while (zproc := _proc(state, q)) is None:
            time.sleep(0.2)
        time.sleep(1)
        zmods = set(live.hello(zproc)["modules"])
        fproc = _proc(state, f"id='{first.env_id}'")
        assert fproc is not None
        fmods = set(live.hello(fproc)["modules"])
        print(f"zygote {len(zmods)} modules; first env {len(fmods)}; first - zygote:")
        print(sorted(fmods - zmods))
        for _ in range(4):
            p = DenvProvider(server=srv.url, api_key=srv.key)
            t0 = time.perf_counter()
            url = p.start_container(IMAGE)
            p.wait_for_ready(url)
            t1 = time.perf_counter()
            cproc = _proc(state, f"id='{p.env_id}'")
            assert cproc is not None
            before = set(live.hello(cproc)["modules"])
            client: Any = GenericEnvClient(base_url=url, provider=p).sync()
            t2 = time.perf_counter()
            client.connect()
            t3 = time.perf_counter()
            client.reset()
            t4 = time.perf_counter()
            after = set(live.hello(cproc)["modules"])
            second: Any = GenericEnvClient(base_url=url, provider=None).sync()
            t5 = time.perf_counter()
            second.connect()
            second.reset()
            t6 = time.perf_counter()
            ms = [1e3 * x for x in (t1 - t0, t3 - t2, t4 - t3, t6 - t5)]
            print(
                f"{p.start}: create+ready {ms[0]:.0f} connect {ms[1]:.0f} reset {ms[2]:.0f}; "
                f"second session connect+reset {ms[3]:.0f} ms; imported in first session: "
                f"{sorted(after - before)}",
                flush=True,
            )
            second.close()
            client.close()
        root.close()
        for line in (state / "server.out").read_text().splitlines():
            if "zygote" in line:
                print(line[-200:])


if __name__ == "__main__":
    main()
