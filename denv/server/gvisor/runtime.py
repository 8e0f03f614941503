"""gVisor on the Docker Engine: the runtime ``denv serve --isolation gvisor`` names for every
container (``RUNTIME``), installing it (``install``) and checking it before a server starts
(``check``).

The runtime is ``denv-runsc`` (a script beside this module, copied to ``WRAPPER``): Debian's
``runsc`` on the ``ptrace`` platform, the one this kind of machine runs (no KVM), with a repair
for runsc 2022-12 on Linux 6.x (the script says which). Docker learns it from the ``runtimes``
of its ``daemon.json``, which it reloads on SIGHUP: nothing else in the engine changes, and
runc stays its default for every other container.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from denv.server.docker.engine import Engine
from denv.server.docker.sdk import engine_errors
from denv.server.gvisor.checkpoint import FIRST_RELEASE, RunscSaver, release
from denv.server.node.abilities import Abilities

RUNTIME = "denv-runsc"  # the runtime's name in the Docker Engine
PACKAGE = "runsc"  # Debian's package of gVisor's runsc
WRAPPER = Path("/usr/local/sbin/denv-runsc")  # where install puts the script
DAEMON_JSON = Path("/etc/docker/daemon.json")
SCRIPT = Path(__file__).with_name("denv-runsc")  # the runtime script, in the wheel
RELOAD_WAIT_S = 15.0  # how long install waits for dockerd to list the runtime
# What an env under gVisor cannot do, and why: the admission refuses those requests (409).
ABILITIES = Abilities(
    live="this server runs every env under --isolation gvisor, in a sandbox with a kernel "
    "of its own, and the live launcher copies a process on this machine's kernel",
    spares="under --isolation gvisor a spare's /work is mounted after it boots, and a gVisor "
    "sandbox sees no mount made after it started (its env would write beside its /work)",
    checkpoint=None,
)
TOO_OLD = (
    "runsc {release} cannot save a server whose listening socket is watched by epoll "
    "(uvicorn, Node, gunicorn), so forks boot from a snapshot of /work: install a runsc "
    "released in 2023 or later (Debian 12: apt-get install -t bookworm-backports runsc; "
    "make gvisor does it) for forks that resume the parent's sandbox"
)


class GvisorUnavailable(RuntimeError):
    """gVisor cannot run here; the message names what is missing and the fix."""


def runsc() -> str | None:
    """The path of ``runsc``, or None when it is not installed."""
    return shutil.which(PACKAGE) or (str(p) if (p := Path("/usr/bin/runsc")).exists() else None)


def check(engine_runtimes: Iterable[str]) -> None:
    """Raise ``GvisorUnavailable`` unless ``runsc`` is installed and the engine (whose
    runtimes are ``engine_runtimes``) has ``denv-runsc``."""
    if runsc() is None:
        raise GvisorUnavailable(
            "--isolation gvisor runs every env under gVisor's runsc, which is not installed: "
            f"apt-get install {PACKAGE}, then denv gvisor install"
        )
    if RUNTIME not in set(engine_runtimes):
        raise GvisorUnavailable(
            f"the Docker Engine has no runtime {RUNTIME}: run `denv gvisor install` as root "
            f"(it adds it to {DAEMON_JSON}'s runtimes and reloads dockerd; runc stays the "
            "default for every other container)"
        )


def install(
    listed: Callable[[], Iterable[str]],
    daemon_json: Path = DAEMON_JSON,
    wrapper: Path = WRAPPER,
    say: Callable[[str], None] = print,
) -> None:
    """Put the runtime script at ``wrapper``, name it in ``daemon_json``'s runtimes and reload
    dockerd, until ``listed()`` (the engine's runtimes) has it. Idempotent."""
    if runsc() is None:
        raise GvisorUnavailable(f"runsc is not installed: apt-get install {PACKAGE}")
    script = SCRIPT.read_bytes()
    if not wrapper.exists() or wrapper.read_bytes() != script:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        _write(wrapper, script, 0o755)
        say(f"wrote {wrapper}")
    config = _read_config(daemon_json)
    entry = {"path": str(wrapper)}
    runtimes = config.setdefault("runtimes", {})
    if not isinstance(runtimes, dict):
        raise GvisorUnavailable(f"{daemon_json}: its runtimes is not an object: fix it by hand")
    if runtimes.get(RUNTIME) != entry or RUNTIME not in set(listed()):
        runtimes[RUNTIME] = entry
        daemon_json.parent.mkdir(parents=True, exist_ok=True)
        _write(daemon_json, (json.dumps(config, indent=2) + "\n").encode(), 0o644)
        say(f"added the runtime {RUNTIME} to {daemon_json}")
        _reload_dockerd()
    deadline = time.monotonic() + RELOAD_WAIT_S
    while RUNTIME not in set(listed()):
        if time.monotonic() > deadline:
            raise GvisorUnavailable(
                f"dockerd did not list the runtime {RUNTIME} within {RELOAD_WAIT_S:.0f} s of "
                f"a reload: is it started with another --config-file than {daemon_json}? "
                "Restart it, then run denv gvisor install again"
            )
        time.sleep(0.2)
    say(
        f"the Docker Engine runs {RUNTIME} (runsc {_runsc_version()}): "
        "denv serve --isolation gvisor"
    )


def _read_config(path: Path) -> dict[str, object]:
    if not path.exists() or not path.read_text().strip():
        return {}
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise GvisorUnavailable(f"{path} is not JSON ({exc}): fix it, then retry") from exc
    if not isinstance(config, dict):
        raise GvisorUnavailable(f"{path} is not a JSON object: fix it, then retry")
    return config


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` whole: a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.denv-tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _reload_dockerd() -> None:
    pids = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout
    if not pids.split():
        raise GvisorUnavailable("dockerd is not running: start it, then denv gvisor install")
    for pid in pids.split():
        os.kill(int(pid), signal.SIGHUP)  # dockerd reloads its runtimes from daemon.json


def _runsc_version() -> str:
    path = runsc()
    if path is None:
        return "missing"
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0].removeprefix("runsc version ") if out else "unknown"


def use(engine: Engine) -> tuple[Abilities, RunscSaver | None]:
    """Create every container of ``engine`` under gVisor from now on, and return what its
    envs then can and cannot do (``ABILITIES``, for the lifecycle's admission) with how a
    sandbox is saved (for the node's checkpoints; None when this runsc cannot save the
    servers envs run: ``TOO_OLD``); ``GvisorUnavailable`` naming the fix when runsc or the
    runtime is missing (``EngineUnavailable`` without an engine)."""
    with engine_errors():
        runtimes = engine.api.info().get("Runtimes", {})
    check(runtimes)
    engine.runtime = RUNTIME
    path, version = runsc(), _runsc_version()
    if path is None or release(version) < FIRST_RELEASE:
        return dataclasses.replace(ABILITIES, checkpoint=TOO_OLD.format(release=version)), None
    return ABILITIES, RunscSaver(path)
