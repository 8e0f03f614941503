"""Where a start copied from a zygote spends its time, by phase, with a second session beside it.

Starts a server of its own (zygotes on), starts the echo env once (a boot, which leaves the
zygote behind), waits for the zygote in the server's store, then 4 times: `start_container`
(the server's copy), `wait_for_ready`, the client's connect (its WebSocket session, the
copy's first), `reset()`, `step()`; then a second client on the same copy: connect and
`reset()` (what a copy costs once its process has served one session). Prints one line per
start. Run from the repository root: `.venv/bin/python bench/live_fork_probe/p6_zygote_phases.py`.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import start_server  # noqa: E402  (the tests' own server runner)
from denv.openenv import DenvProvider  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

IMAGE = "denv-echo-env:latest"


def _zygote_ready(state: Path) -> bool:
    with sqlite3.connect(state / "denv.db") as con:
        q = "SELECT COUNT(*) FROM envs WHERE owner LIKE 'zygote:%' AND status='healthy'"
        return bool(con.execute(q).fetchone()[0])


def main() -> None:
    parent = Path(tempfile.mkdtemp(prefix="denv-p6-"))
    state = parent / "state"
    with start_server(state, "--zygotes") as srv:
        first = DenvProvider(server=srv.url, api_key=srv.key)
        root: Any = GenericEnvClient.from_docker_image(IMAGE, provider=first).sync()
        while not _zygote_ready(state):
            time.sleep(0.2)
        for _ in range(4):
            p = DenvProvider(server=srv.url, api_key=srv.key)
            t0 = time.perf_counter()
            url = p.start_container(IMAGE)
            t1 = time.perf_counter()
            p.wait_for_ready(url)
            t2 = time.perf_counter()
            client: Any = GenericEnvClient(base_url=url, provider=p).sync()
            client.connect()
            t3 = time.perf_counter()
            client.reset()
            t4 = time.perf_counter()
            client.step({"message": "x"})
            t5 = time.perf_counter()
            second: Any = GenericEnvClient(base_url=url, provider=None).sync()
            t6 = time.perf_counter()
            second.connect()
            t7 = time.perf_counter()
            second.reset()
            t8 = time.perf_counter()
            ms = [1e3 * x for x in (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t7 - t6, t8 - t7)]
            print(
                f"{p.start}: create {ms[0]:.0f} ready {ms[1]:.0f} connect {ms[2]:.0f} "
                f"reset {ms[3]:.0f} step {ms[4]:.0f} ms; second session: connect {ms[5]:.0f} "
                f"reset {ms[6]:.0f} ms",
                flush=True,
            )
            client.close()
        root.close()
    parent.rmdir()  # start_server removed the state dir


if __name__ == "__main__":
    main()
