"""Run inside a probe container: which of setns(net), setns(mnt), unshare(user) this process
may do with the capabilities it was given, and whether a dropped capability comes back.

    python setns_try.py    (the spare's namespaces bind-mounted at /ns/net and /ns/mnt)
Prints one line of JSON.
"""

from __future__ import annotations

import ctypes
import json
import os

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000


def attempt(fn: object, *args: int) -> str:
    rc = fn(*args)  # type: ignore[operator]
    return "ok" if rc == 0 else os.strerror(ctypes.get_errno())


def cap_eff() -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff"):
                return line.split()[1]
    return "?"


def main() -> None:
    out = {"CapEff": cap_eff()}
    pid = os.fork()
    if pid == 0:  # a child for the user namespace attempt, so the rest is not affected
        os._exit(0 if libc.unshare(CLONE_NEWUSER) == 0 else ctypes.get_errno())
    out["unshare(user)"] = "ok" if os.waitpid(pid, 0)[1] == 0 else "EPERM or refused"
    out["setns(net)"] = attempt(libc.setns, os.open("/ns/net", os.O_RDONLY), CLONE_NEWNET)
    out["setns(mnt)"] = attempt(libc.setns, os.open("/ns/mnt", os.O_RDONLY), CLONE_NEWNS)
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    libc.capset(hdr, data)  # drop everything
    data2 = (ctypes.c_uint32 * 6)(1 << 21, 1 << 21, 0, 0, 0, 0)  # ask CAP_SYS_ADMIN back
    out["regain CAP_SYS_ADMIN after drop"] = attempt(libc.capset, hdr, data2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
