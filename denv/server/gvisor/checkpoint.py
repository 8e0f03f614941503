"""gVisor's way of saving a running sandbox (a ``SandboxSaver`` for the Docker node's
checkpoints): ``runsc checkpoint --leave-running`` on the container, in the state directory
Docker's shim gave runsc (read off the sandbox process's own command line).

The restore is the runtime script's (``denv-runsc``): a container created with
``RESTORE_ENV`` is resumed from that image where Docker asks runsc to start it.

runsc releases before 2023 cannot save the servers envs run (a listening socket watched by
epoll: 'endpoint still has waiters upon save'), so ``saver()`` offers no saver for them, and
says why (``docs/isolation.md``).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from denv.server.node.errors import CheckpointUnsupported

SAVE_TIMEOUT_S = 120.0
# Uncompressed: measured on the echo env's fork(8), flate's 39 MB image took 0.59 s to save
# and 5.1-5.3 s to 8 children ready, an uncompressed 150 MB one 0.25 s and 2.9-3.1 s (it is
# deleted once the children started). --exclude-committed-zero-pages left it at 150 MB.
SAVE_FLAGS = ("--compression=none",)
# A connection the env's server is still closing (its client left a moment ago, and the
# node saw none left open) is saved once it is gone: tried again this many times, this long
# apart.
CONNECTED_TRIES, CONNECTED_WAIT_S = 3, 0.15
CONNECTED = "cannot be saved in connected state"
# The first release whose netstack saves a listener watched by epoll (Debian's
# bookworm-backports has 2024-07-29; bookworm's own 2022-12-19 cannot).
FIRST_RELEASE = 20230000


def release(version_line: str) -> int:
    """runsc's release as a number (``0.0~20240729.0`` -> 20240729); 0 when unknown."""
    found = re.search(r"(20\d{6})", version_line)
    return int(found.group(1)) if found else 0


class RunscSaver:
    """Saves a container's sandbox with ``runsc`` (the binary at ``path``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def save(self, container: str, pid: int, dest: Path) -> None:
        root = state_root(pid)
        cmd = [self.path, f"--root={root}", "checkpoint", "--leave-running", *SAVE_FLAGS]
        cmd += [f"--image-path={dest}", container]
        why = ""
        for attempt in range(CONNECTED_TRIES):
            for partial in dest.iterdir():  # a failed save's file: runsc will not overwrite it
                partial.unlink()
            said = _run(cmd)
            if said is None:
                return
            why = said
            if CONNECTED not in why:
                raise CheckpointUnsupported(f"runsc could not save the sandbox: {why[:500]}")
            if attempt + 1 < CONNECTED_TRIES:
                time.sleep(CONNECTED_WAIT_S)
        raise CheckpointUnsupported(
            "the env has an open connection (a WebSocket session, or a request in flight), "
            "and this runsc cannot save a connected TCP endpoint (runsc said: "
            f"{why[why.find(CONNECTED) :][:200]})"
        )


def _run(cmd: list[str]) -> str | None:
    """None when ``cmd`` succeeded, else what runsc said (its error, not its stack)."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SAVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"it did not save the sandbox within {SAVE_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return None
    said = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    errors = [line for line in said if "checkpoint failed" in line or "error" in line.lower()]
    return (errors or said or [f"exit status {done.returncode}"])[0]


def state_root(pid: int) -> str:
    """The ``--root`` runsc's sandbox process ``pid`` was started with (Docker's shim's state
    directory for the runtime)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError as exc:
        raise CheckpointUnsupported(f"the sandbox's process {pid} is gone: {exc}") from exc
    for i, arg in enumerate(argv):
        text = arg.decode(errors="replace")
        if text.startswith("--root="):
            return text.removeprefix("--root=")
        if text == "--root" and i + 1 < len(argv):
            return argv[i + 1].decode(errors="replace")
    raise CheckpointUnsupported(
        f"process {pid} is not a runsc sandbox (no --root on its command line): is the env "
        "running under --isolation gvisor?"
    )
