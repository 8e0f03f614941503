"""Probe 3: CRIU checkpoint of the booted echo server, and a direct ``criu restore``.

    CRIU=/path/to/criu .venv/bin/python bench/live_fork_probe/p3_criu.py     (as root)

Records which criu this machine has (Debian bookworm's 3.17.1 cannot start on this kernel:
``criu check`` fails in its vDSO parser), then, with the criu in $CRIU (v4.2 built from
source when the packaged one fails): runs the echo server on the host (own session, stdio to
files, 127.0.0.1:18181), dumps it, and restores it directly (no Docker) several times, timing
the restore and the first 200 on /health; tries a second restore while the first runs (same
pids); times Docker's own container setup for comparison. Writes p3_criu.json.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from common import HERE, PREFIX, median, private_kb, sh, wait_http, write_result

CRIU = os.environ.get("CRIU", "criu")
ROOT = Path("/tmp") / (PREFIX + "criu")
PORT = 18181
REPO = HERE.parent.parent


def run(*args: str) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True)
    return p.returncode, (p.stdout + p.stderr).strip()[-600:], time.perf_counter() - t0


def tree_pids(pid: int) -> list[int]:
    out = [pid]
    for p in out:
        with contextlib.suppress(OSError):
            for t in os.listdir(f"/proc/{p}/task"):
                out += [int(k) for k in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
    return out


def pid_on_port() -> int | None:
    _, out, _ = run("ss", "-ltnpH", f"sport = :{PORT}")
    if "pid=" not in out:
        return None
    return int(out.split("pid=")[1].split(",")[0])


def main() -> None:
    result: dict[str, Any] = {"command": f"CRIU={CRIU} .venv/bin/python {Path(__file__).name}"}
    result["apt_policy"] = run("apt-cache", "policy", "criu")[1]
    result["packaged_criu_check"] = run("/usr/sbin/criu", "check")[1]
    result["criu_version"] = run(CRIU, "--version")[1]
    result["criu_check"] = run(CRIU, "check")[1]
    result["docker_checkpoint"] = run("docker", "checkpoint", "ls", "none")[1]
    shutil.rmtree(ROOT, ignore_errors=True)
    img = ROOT / "img"
    img.mkdir(parents=True)
    log = open(ROOT / "server.log", "w")  # noqa: SIM115 (stays open for the server)
    server = subprocess.Popen(
        [str(REPO / ".venv/bin/python"), "-m", "uvicorn", "echo_env.app:app",
         "--host", "127.0.0.1", "--port", str(PORT), "--log-level", "warning"],
        cwd=REPO / "envs/echo", stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        start_new_session=True,
    )  # fmt: skip
    restored: list[int] = []
    try:
        result["boot_s"] = wait_http("127.0.0.1", PORT, "/health", 60)
        result["server_kb"] = private_kb(server.pid)
        rc, out, dt = run(CRIU, "dump", "-t", str(server.pid), "-D", str(img), "-o", "dump.log")
        result["dump"] = {"rc": rc, "s": dt, "out": out}
        server.wait(5)
        result["image_mb"] = sum(f.stat().st_size for f in img.iterdir()) / 2**20
        restores = []
        for _ in range(5):
            rc, out, dt = run(CRIU, "restore", "-D", str(img), "-d", "-o", "restore.log")
            if rc != 0:
                result["restore_error"] = out + (img / "restore.log").read_text()[-1500:]
                break
            ready = wait_http("127.0.0.1", PORT, "/health", 30)
            pid = pid_on_port()
            row = {"restore_s": dt, "health_after_restore_s": ready, "pid": pid}
            if pid:
                row["private_kb"] = private_kb(pid)
            if len(restores) == 0:  # a second restore of the same image while this one runs
                rc2, _, _ = run(CRIU, "restore", "-D", str(img), "-d", "-o", "restore2.log")
                tail = (img / "restore2.log").read_text()[-400:] if rc2 else ""
                result["second_concurrent_restore"] = {"rc": rc2, "log_tail": tail}
            restores.append(row)
            if pid:
                for p in reversed(tree_pids(pid)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGKILL)
                for _ in range(100):  # until the pid is free again (criu restores it)
                    if not os.path.exists(f"/proc/{pid}"):
                        break
                    time.sleep(0.05)
        result["restores"] = restores
        if restores:
            result["restore_s_median"] = median([r["restore_s"] for r in restores])
            result["restore_to_health_s_median"] = median(
                [r["restore_s"] + r["health_after_restore_s"] for r in restores]
            )
        # Docker's own part of a restore through it: a container's create + start, no app.
        starts = []
        for i in range(5):
            t0 = time.perf_counter()
            sh("docker", "run", "-d", "--name", f"{PREFIX}floor{i}", "denv-python-base:3.11",
               "sleep", "60")  # fmt: skip
            starts.append(time.perf_counter() - t0)
            sh("docker", "rm", "-f", f"{PREFIX}floor{i}")
        result["docker_run_sleep_s_median"] = median(starts)
        print({k: v for k, v in result.items() if k not in ("apt_policy",)})
        write_result("p3_criu", result)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        pid = pid_on_port()
        if pid:
            os.kill(pid, signal.SIGKILL)
        log.close()
        for r in restored:
            with contextlib.suppress(ProcessLookupError):
                os.kill(r, signal.SIGKILL)


if __name__ == "__main__":
    main()
