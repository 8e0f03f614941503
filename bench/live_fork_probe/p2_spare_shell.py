"""Probe 2b, end to end: a live child of the echo server, serving the parent's memory at a
spare shell's IP, with its own /work (an overlay over the parent's /work) and the spare's cgroup.

    .venv/bin/python bench/live_fork_probe/p2_spare_shell.py     (as root)

The env's container keeps --cap-drop ALL and no-new-privileges; it needs a seccomp profile
that lets an unprivileged process create a user namespace (here seccomp=unconfined stands in
for "Docker's default profile plus unshare/clone(CLONE_NEWUSER)"). Per child:

1. the server forks at its quiescent point; the child unshares user+mount+net namespaces
   (no capability outside them) and waits;
2. a host-side helper (root on the host, never inside the env) plumbs the child: moves the
   spare shell's eth0 (and so its IP) into the child's netns, moves the child into the spare's
   cgroups, and attaches an overlay (lower: the parent's /work, upper: the spare's) at /work in
   the child's mount namespace (mount_into.py: open_tree + setns + move_mount);
3. the child drops every capability of its user namespace, sets no_new_privs, listens on :8000.

Checks the child's memory (requests seen by the parent), /work (parent's file seen, the child's
write not seen by the parent), what it can see and signal. Writes p2_spare_shell.json.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    HERE,
    PREFIX,
    call,
    ctl,
    host_pid,
    kill,
    median,
    private_kb,
    sh,
    start_server,
    stop_server,
    wait_http,
    write_result,
)

NET = PREFIX + "net"
N = 8


def plumb(child: int, spare: dict[str, Any], lower: Path, base: Path) -> dict[str, float]:
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    Path(f"/proc/{child}/uid_map").write_text("0 0 1")  # as newuidmap would, from outside
    Path(f"/proc/{child}/gid_map").write_text("0 0 1")
    t["idmap_ms"] = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    for procs in Path("/sys/fs/cgroup").glob(f"*/*/{spare['cid']}/cgroup.procs"):
        with contextlib.suppress(OSError):
            procs.write_text(str(child))
    t["cgroup_ms"] = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    sh("nsenter", "-t", str(spare["pid"]), "-n", "ip", "link", "set", "eth0", "netns", str(child))
    script = (
        f"ip link set lo up && ip addr add {spare['ip']}/{spare['prefix']} dev eth0 && "
        f"ip link set eth0 up && ip route add default via {spare['gw']}"
    )
    sh("nsenter", "-t", str(child), "-n", "sh", "-c", script)
    t["net_ms"] = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    upper, work, merged = base / "upper", base / "work", base / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    sh(
        "mount", "-t", "overlay", "overlay", "-o",
        f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged),
    )  # fmt: skip
    subprocess.run(
        [sys.executable, str(HERE / "mount_into.py"), str(child), str(merged), "/work"], check=True
    )
    sh("umount", "-l", str(merged))  # the host no longer needs its view
    t["work_ms"] = (time.perf_counter() - t0) * 1e3
    return t


def main() -> None:
    root = Path("/tmp") / (PREFIX + "spare-shell")
    parent_work = root / "parent-work"
    parent_work.mkdir(parents=True, exist_ok=True)
    (parent_work / "parent.txt").write_text("written by the parent before the fork\n")
    sh("docker", "network", "create", NET)
    spares: list[dict[str, Any]] = []
    srv: dict[str, Any] | None = None
    pids: list[int] = []
    try:
        for i in range(N):
            cid = sh(
                "docker", "run", "-d", "--name", f"{PREFIX}spare{i}", "--network", NET,
                "--cap-drop", "ALL", "denv-python-base:3.11", "sleep", "infinity",
            )  # fmt: skip
            net = sh("docker", "inspect", "-f", "{{json .NetworkSettings.Networks}}", cid)
            info = __import__("json").loads(net)[NET]
            spares.append(
                {
                    "cid": cid,
                    "pid": int(sh("docker", "inspect", "-f", "{{.State.Pid}}", cid)),
                    "ip": info["IPAddress"],
                    "prefix": info["IPPrefixLen"],
                    "gw": info["Gateway"],
                }
            )
        srv = start_server(
            "p2",
            "--security-opt", "seccomp=unconfined", "-v", f"{parent_work}:/work",
            network=NET,
        )  # fmt: skip
        call(srv["ip"], 8000, "/reset", {})
        ports = [9301 + i for i in range(N)]
        t0 = time.perf_counter()
        reply = ctl(
            srv, {"op": "fork", "ports": ports, "freeze": True, "reset_pools": True, "userns": True}
        )
        t_fork = time.perf_counter() - t0
        plumbs = []
        for port, spare in zip(ports, spares, strict=True):
            ready = srv["ctl"] / f"ready-{port}"
            while not ready.exists():
                errors = list(srv["ctl"].glob("error-*"))
                if errors:
                    raise RuntimeError(errors[0].read_text())
                time.sleep(0.0005)
            child = host_pid(srv["pid"], int(ready.read_text() or 0) or 0)
            pids.append(child)
            plumbs.append(plumb(child, spare, parent_work, root / f"child{port}"))
            (srv["ctl"] / f"go-{port}").write_text("go")
        for spare in spares:
            wait_http(spare["ip"], 8000, "/health", 10)
        t_ready = time.perf_counter() - t0
        parent_state = call(srv["ip"], 8000, "/_probe/state")[1]
        child_state = call(spares[0]["ip"], 8000, "/_probe/state")[1]
        before = (parent_work / ".denv").exists() and sorted(
            str(p.relative_to(parent_work)) for p in (parent_work / ".denv").rglob("*")
        )
        call(spares[0]["ip"], 8000, "/step", {"action": {"message": "child 0 writes /work"}})
        child_upper = sorted(
            str(p.relative_to(root)) for p in (root / f"child{ports[0]}" / "upper").rglob("*")
        )
        result = {
            "command": ".venv/bin/python bench/live_fork_probe/p2_spare_shell.py",
            "children": N,
            "fork_reply_ms": t_fork * 1e3,
            "fork_to_all_ready_ms": t_ready * 1e3,
            "server_reply": reply,
            "plumb_ms_median": {k: median([p[k] for p in plumbs]) for k in plumbs[0]},
            "child0_state": child_state,
            "parent_seen_at_check": parent_state["seen"],
            "parent_work_before_child_write": before,
            "parent_work_after_child_write": sorted(
                str(p.relative_to(parent_work)) for p in parent_work.rglob("*")
            ),
            "parent_sees_child_write": call(srv["ip"], 8000, "/state")[1],
            "child0_state_after_write": call(spares[0]["ip"], 8000, "/state")[1],
            "child0_upper_after_write": child_upper,
            "child0_private_kb": private_kb(pids[0]),
            "child0_cgroup": Path(f"/proc/{pids[0]}/cgroup").read_text().splitlines()[:3],
        }
        print(result)
        write_result("p2_spare_shell", result)
    finally:
        kill(pids)
        if srv is not None:
            stop_server(srv)
        for s in spares:
            sh("docker", "rm", "-f", s["cid"], check=False)
        sh("docker", "network", "rm", NET, check=False)
        for m in root.glob("child*/merged"):
            sh("umount", "-l", str(m), check=False)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
