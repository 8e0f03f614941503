"""Probe 4: an overlay for a child's /work, mounted inside an unprivileged user namespace.

    .venv/bin/python bench/live_fork_probe/p4_userns_overlay.py     (as root)

In containers run as denv runs envs (--cap-drop ALL, no-new-privileges; seccomp=unconfined
standing in for "default profile plus unshare(CLONE_NEWUSER)"), a process makes a user + mount
namespace with util-linux ``unshare -Urm`` and mounts an overlay whose lower is an ext4
directory bind-mounted from the host, with the upper on: the same ext4 bind mount (with and
without userxattr), a tmpfs mounted inside the namespace (overlay_try.py does the mounts).
Run as uid 1000 (mapped to 0) and as root (no map: mapping 0 needs CAP_SETFCAP).
Records each mount's result and the kernel's log lines. Writes p4_userns_overlay.json.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from common import HERE, PREFIX, write_result

ROOT = Path("/tmp") / (PREFIX + "userns-overlay")
CASES = ["ext4", "ext4-userxattr", "tmpfs"]
# uid 1000 maps itself to 0 (-r); root cannot (mapping uid 0 needs CAP_SETFCAP since 5.12),
# so root runs in a user namespace without a map.
UNSHARE = {"1000:1000": ["unshare", "-Urm"], "0:0": ["unshare", "-Um"]}
UNSHARE["1000:1000 on root-owned dirs"] = UNSHARE["1000:1000"]


def main() -> None:
    rows: list[dict[str, Any]] = []
    for user in UNSHARE:
        for name in CASES:
            shutil.rmtree(ROOT, ignore_errors=True)
            for d in ("lower", "upper", "work"):
                (ROOT / d).mkdir(parents=True)
            (ROOT / "lower" / "parent.txt").write_text("parent's file\n")
            uid, gid = (0, 0) if "root-owned" in user else (int(x) for x in user.split(":"))
            for p in [ROOT, *ROOT.rglob("*")]:
                os.chown(p, uid, gid)
            args = [
                "docker", "run", "--rm", "--user", user.split()[0], "--cap-drop", "ALL",
                "--security-opt", "no-new-privileges", "--security-opt", "seccomp=unconfined",
                "-v", f"{ROOT}:/data", "-v", f"{HERE}:/probe:ro", "denv-python-base:3.11",
                *UNSHARE[user], "python3", "/probe/overlay_try.py", name,
            ]  # fmt: skip
            before = len(subprocess.run(["dmesg"], capture_output=True, text=True).stdout)
            p = subprocess.run(args, capture_output=True, text=True)
            log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout[before:]
            row = {
                "user": user,
                "case": name,
                "ok": "MOUNT_OK" in p.stdout,
                "output": (p.stdout + p.stderr).strip()[-300:],
                "kernel_log": [ln for ln in log.splitlines() if "overlay" in ln.lower()][-3:],
                "upper_after": sorted(x.name for x in (ROOT / "upper").iterdir()),
            }
            print(row)
            rows.append(row)
    shutil.rmtree(ROOT, ignore_errors=True)
    write_result(
        "p4_userns_overlay",
        {"command": ".venv/bin/python bench/live_fork_probe/p4_userns_overlay.py", "rows": rows},
    )


if __name__ == "__main__":
    main()
