"""Probe 2a: what joining a spare shell's namespaces takes.

    .venv/bin/python bench/live_fork_probe/p2_setns_caps.py     (as root)

Starts a spare shell (a container that only holds a network namespace, a cgroup and /work),
then, in containers run as denv runs envs (--cap-drop ALL, no-new-privileges, Docker's default
seccomp) with capabilities added back one set at a time, tries setns(net) and setns(mnt) into
the spare (its namespace files bind-mounted in), unshare(CLONE_NEWUSER), and raising a dropped
capability again. Writes p2_setns_caps.json.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from common import HERE, PREFIX, sh, write_result

CAP_SETS: list[list[str]] = [[], ["SYS_ADMIN"], ["SYS_CHROOT"], ["SYS_ADMIN", "SYS_CHROOT"]]


def main() -> None:
    pins = Path(tempfile.gettempdir()) / (PREFIX + "ns-pins")
    spare = sh(
        "docker", "run", "-d", "--name", PREFIX + "spare-caps", "--cap-drop", "ALL",
        "denv-python-base:3.11", "sleep", "infinity",
    )  # fmt: skip
    try:
        pid = sh("docker", "inspect", "-f", "{{.State.Pid}}", spare)
        # Docker refuses /proc/PID/ns/* as a bind source: pin them on the host first.
        pins.mkdir(exist_ok=True)
        for ns in ("net", "mnt"):
            (pins / ns).touch()
            sh("mount", "--bind", f"/proc/{pid}/ns/{ns}", str(pins / ns))
        rows: list[dict[str, Any]] = []
        for seccomp in ("default", "unconfined"):
            for caps in CAP_SETS:
                args = ["docker", "run", "--rm", "--cap-drop", "ALL"]
                for c in caps:
                    args += ["--cap-add", c]
                args += ["--security-opt", "no-new-privileges"]
                if seccomp == "unconfined":
                    args += ["--security-opt", "seccomp=unconfined"]
                args += [
                    "-v", f"{pins}/net:/ns/net:ro", "-v", f"{pins}/mnt:/ns/mnt:ro",
                    "-v", f"{HERE}:/probe:ro", "denv-python-base:3.11",
                    "python3", "/probe/setns_try.py",
                ]  # fmt: skip
                res = json.loads(sh(*args).splitlines()[-1])
                row = {"seccomp": seccomp, "caps": "+".join(caps) or "none", **res}
                print(row)
                rows.append(row)
        write_result(
            "p2_setns_caps",
            {"command": ".venv/bin/python bench/live_fork_probe/p2_setns_caps.py", "rows": rows},
        )
    finally:
        for ns in ("net", "mnt"):
            sh("umount", str(pins / ns), check=False)
        shutil.rmtree(pins, ignore_errors=True)
        sh("docker", "rm", "-f", spare, check=False)


if __name__ == "__main__":
    main()
