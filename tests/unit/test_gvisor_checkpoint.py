"""gVisor's sandbox checkpoints without Docker or gVisor: the release check, where the saver
finds runsc's state root, how it retries a save a closing connection refused, and the
runtime script's restore where Docker asks it to start a container, each against a stub
runsc (a shell script that records what it was asked). The real runsc saves and restores
in tests/e2e/test_gvisor.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from denv.server.docker import checkpoints
from denv.server.docker.checkpoints import RESTORE_ENV
from denv.server.gvisor import checkpoint
from denv.server.gvisor.checkpoint import CONNECTED, RunscSaver, release, state_root
from denv.server.gvisor.runtime import SCRIPT
from denv.server.node.errors import CheckpointUnsupported

ROOT = "/run/docker/runtime-runc/moby"  # where Docker's shim keeps runsc's state


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# -- the release


def test_the_release_is_read_off_runscs_version_line() -> None:
    # Guards FIRST_RELEASE's comparison: a release read wrong lets bookworm's runsc save.
    assert release("0.0~20240729.0") == 20240729
    assert release("runsc version release-20221219.0") == 20221219
    assert release("runsc version 0.0~20240729.0\nspec: 1.1.0-rc.1") == 20240729
    assert release("runsc version unknown") == 0
    assert release("") == 0


# -- the state root, off the sandbox process's command line


@pytest.fixture
def spawn() -> Iterator[Callable[..., int]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> int:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", *args])
        procs.append(proc)
        # Popen (vfork) may return before the kernel has set the new program's argv up:
        # /proc/<pid>/cmdline is empty for that moment. A sandbox has long been running.
        cmdline, deadline = Path(f"/proc/{proc.pid}/cmdline"), time.monotonic() + 10
        while not cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.001)
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_the_state_root_is_the_sandbox_process_s_root_flag(spawn: Callable[..., int]) -> None:
    # Guards both spellings runsc's parent may use for --root (Docker's shim passes one).
    assert state_root(spawn("boot", "--root=/x/y", "--log=/l")) == "/x/y"
    assert state_root(spawn("--log", "/l", "--root", "/x/z", "boot")) == "/x/z"


def test_a_process_without_a_root_is_not_a_gvisor_sandbox(spawn: Callable[..., int]) -> None:
    # Guards the message an env under runc (or a wrong pid) gets: it names gVisor.
    pid = spawn("boot", "--log=/l")
    with pytest.raises(CheckpointUnsupported, match="gvisor") as refused:
        state_root(pid)
    assert refused.value.code == "conflict"


def test_a_gone_process_is_named() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass", "--root=/x"])
    proc.wait()
    with pytest.raises(CheckpointUnsupported, match=f"process {proc.pid} is gone"):
        state_root(proc.pid)


# -- the saver, against a stub runsc

SAVE_STUB = """#!/bin/sh
# A stub runsc checkpoint: records its argv, fails its first {fails} calls as runsc does
# while a connection is still closing (leaving a partial image behind), then saves.
printf '%s\\n' "$*" >> {calls}
n=$(wc -l < {calls})
for a in "$@"; do
  case "$a" in --image-path=*) img="${{a#--image-path=}}" ;; esac
done
if [ -e "$img/checkpoint.img" ]; then  # runsc does not overwrite an image
  echo "checkpoint failed: image file $img/checkpoint.img exists" >&2
  exit 2
fi
if [ "$n" -le {fails} ]; then
  echo partial > "$img/checkpoint.img"
  echo "W1207 11:00:00.000000 1 save.go:1] saving" >&2
  echo "checkpoint failed: checkpointing container: encoding error: \
endpoint cannot be saved in connected state: local 172.30.0.2:8000, remote 172.30.0.1:4242" >&2
  exit 128
fi
echo whole > "$img/checkpoint.img"
"""


@pytest.fixture
def saver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint, "CONNECTED_WAIT_S", 0)
    monkeypatch.setattr(checkpoint, "state_root", lambda pid: ROOT)


def _save_stub(tmp_path: Path, fails: int) -> tuple[RunscSaver, Path, Path]:
    calls = tmp_path / "calls"
    stub = _script(tmp_path / "runsc", SAVE_STUB.format(fails=fails, calls=calls))
    dest = tmp_path / "images" / "env_1-1-0"
    dest.mkdir(parents=True)
    return RunscSaver(str(stub)), dest, calls


@pytest.mark.usefixtures("saver")
def test_a_save_refused_for_a_closing_connection_is_tried_again_from_scratch(
    tmp_path: Path,
) -> None:
    # Guards the retry (CONNECTED in runsc's error) and the partial image's removal before
    # each try: without the removal the stub's second call fails as runsc would.
    runsc, dest, calls = _save_stub(tmp_path, fails=checkpoint.CONNECTED_TRIES - 1)
    runsc.save("cid", 4242, dest)
    flags = " ".join(checkpoint.SAVE_FLAGS)
    one = f"--root={ROOT} checkpoint --leave-running {flags} --image-path={dest} cid"
    assert calls.read_text().splitlines() == [one] * checkpoint.CONNECTED_TRIES
    assert [p.name for p in dest.iterdir()] == ["checkpoint.img"]
    assert (dest / "checkpoint.img").read_text() == "whole\n"


@pytest.mark.usefixtures("saver")
def test_a_connection_that_stays_open_is_named(tmp_path: Path) -> None:
    # Guards the bounded retry and the words a WebSocket session's fork logs (its
    # children boot): the connection, and runsc's own line from the connected state on.
    runsc, dest, calls = _save_stub(tmp_path, fails=100)
    with pytest.raises(CheckpointUnsupported) as refused:
        runsc.save("cid", 4242, dest)
    said = refused.value.message
    assert "open connection" in said and "WebSocket" in said, said
    assert f"runsc said: {CONNECTED}: local 172.30.0.2:8000" in said, said
    assert len(calls.read_text().splitlines()) == checkpoint.CONNECTED_TRIES


@pytest.mark.usefixtures("saver")
def test_another_refusal_is_raised_at_once_with_runscs_error_line(tmp_path: Path) -> None:
    # Guards that only the connected state is retried, and that runsc's error line (not
    # its log's noise before it) is what the message carries.
    calls = tmp_path / "calls"
    stub = _script(
        tmp_path / "runsc",
        f"""#!/bin/sh
printf '%s\\n' "$*" >> {calls}
echo "I1207 11:00:00.000000 1 main.go:1] ***************************" >&2
echo "checkpoint failed: container cid is not running" >&2
exit 128
""",
    )
    dest = tmp_path / "img"
    dest.mkdir()
    with pytest.raises(CheckpointUnsupported) as refused:
        RunscSaver(str(stub)).save("cid", 4242, dest)
    assert refused.value.message == (
        "runsc could not save the sandbox: checkpoint failed: container cid is not running"
    )
    assert len(calls.read_text().splitlines()) == 1


# -- the runtime script: `start` of a container created with RESTORE_ENV is a restore


def test_the_script_reads_the_variable_the_node_sets() -> None:
    # Guards a rename on one side only: boot.py sets RESTORE_ENV, the script greps its own.
    text = SCRIPT.read_text()
    named = re.findall(r'"(DENV_[A-Z_]+)=', text)  # the grep's pattern and the sed's
    assert named == [RESTORE_ENV, RESTORE_ENV], named


RUNTIME_STUB = """#!/bin/sh
# A stub runsc: `state` answers as runsc does (indented JSON); any other call records its
# argv, one argument a line.
if [ "$1" = --root ] && [ "$3" = state ]; then
  printf '%s\\n' "$*" >> {dir}/state-calls
  cat <<EOF
{{
  "ociVersion": "1.0.2-dev",
  "id": "$4",
  "status": "created",
  "pid": {pid},
  "bundle": "{bundle}",
  "rootfs": "{bundle}/rootfs",
  "created": "2026-12-07T11:00:00.000000000Z",
  "owner": ""
}}
EOF
  exit 0
fi
printf '%s\\n' "$@" > {dir}/argv
"""


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bundle (its config.json without the variable; tests add it) and a stub runsc named
    by DENV_RUNSC; the sandbox's pid is this process's (its netns, the host's, is enough
    for the script's nsenter)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    stub = RUNTIME_STUB.format(dir=tmp_path, pid=os.getpid(), bundle=bundle)
    monkeypatch.setenv("DENV_RUNSC", str(_script(tmp_path / "runsc", stub)))
    monkeypatch.delenv("DENV_RUNSC_PLATFORM", raising=False)
    return tmp_path


def _config(bundle: Path, env: list[str]) -> None:
    # Docker writes the OCI config compact, as json.dumps with these separators does.
    config = {"ociVersion": "1.2.0", "process": {"args": ["uvicorn", "app:app"], "env": env}}
    (bundle / "config.json").write_text(json.dumps(config, separators=(",", ":")))


def _run_script(*args: str) -> None:
    done = subprocess.run(["sh", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def _needs_namespaces() -> None:
    """The `start` path enters the sandbox's netns and a mount namespace of its own."""
    if os.geteuid() != 0:
        pytest.skip("denv-runsc's start path runs nsenter and unshare --mount: needs root")
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"denv-runsc's start path needs {' and '.join(missing)} (util-linux)")


GLOBAL = ["--root", "/r", "--log", "/l.json", "--log-format", "json"]  # as Docker's shim


def test_a_container_created_with_a_checkpoint_is_restored_where_docker_starts_it(
    runtime: Path,
) -> None:
    # Guards the rewrite of `start` into runsc restore: the image from the bundle's env,
    # the bundle from runsc state, the global flags kept before it, the id last.
    _needs_namespaces()
    bundle = runtime / "bundle"
    _config(bundle, ["PATH=/usr/bin", f"{RESTORE_ENV}=/some/img", "HOME=/root"])
    _run_script(*GLOBAL, "start", "ctr1")
    assert (runtime / "state-calls").read_text().splitlines() == ["--root /r state ctr1"]
    assert (runtime / "argv").read_text().splitlines() == [
        "--platform=ptrace",
        *GLOBAL,
        "restore",
        "--detach",
        "--image-path=/some/img",
        f"--bundle={bundle}",
        "ctr1",
    ]


def test_a_container_created_without_one_is_started(runtime: Path) -> None:
    # Guards that only the variable makes a restore: a boot's start is runsc's start.
    _needs_namespaces()
    _config(runtime / "bundle", ["PATH=/usr/bin", "DENV_ENV_ID=env_1"])
    _run_script(*GLOBAL, "start", "ctr1")
    assert (runtime / "argv").read_text().splitlines() == [
        "--platform=ptrace",
        *GLOBAL,
        "start",
        "ctr1",
    ]


def test_other_commands_go_to_runsc_as_they_are(runtime: Path) -> None:
    # No namespaces here: only `start` is repaired (or made a restore).
    _config(runtime / "bundle", [f"{RESTORE_ENV}=/some/img"])
    _run_script(*GLOBAL, "create", "--bundle", str(runtime / "bundle"), "ctr1")
    assert not (runtime / "state-calls").exists()
    assert (runtime / "argv").read_text().splitlines() == [
        "--platform=ptrace",
        *GLOBAL,
        "create",
        "--bundle",
        str(runtime / "bundle"),
        "ctr1",
    ]


def test_a_save_waits_for_no_connection_to_the_envs_address() -> None:
    """The node tries no save while this machine holds a connection to the env's address (a
    failed save stalls it): counted from /proc/net/tcp, but those this side closed first."""
    server = socket.create_server(("127.0.0.3", 0))
    client = socket.socket()
    client.bind(("127.0.0.1", 0))
    client.connect(server.getsockname())
    accepted, _ = server.accept()
    try:
        assert checkpoints.connections_to({"127.0.0.3"}) == 1
        with pytest.raises(CheckpointUnsupported) as open_one:
            checkpoints.wait_quiet("env_x", {"127.0.0.3"})
        assert "1 open connection" in str(open_one.value) and "WebSocket" in str(open_one.value)
        client.close()  # this side first (FIN_WAIT2 here, still counted) ...
        accepted.close()  # ... then the env's server, on its EOF: TIME_WAIT here, gone there
        checkpoints.wait_quiet("env_x", {"127.0.0.3"})
        assert checkpoints.connections_to({"127.0.0.3"}) == 0
    finally:
        client.close()
        accepted.close()
        server.close()


def test_a_connection_this_side_closed_is_waited_for_past_the_open_ones_limit() -> None:
    """One this side closed (FIN_WAIT2 here) is the sandbox's to close: waited for longer than
    an open one (a CI run's sandbox took over QUIET_WAIT_S under load), then the save goes."""
    server = socket.create_server(("127.0.0.3", 0))
    client = socket.socket()
    client.bind(("127.0.0.1", 0))
    client.connect(server.getsockname())
    accepted, _ = server.accept()
    try:
        client.close()  # this side first: FIN_WAIT2 until the env's server closes its end
        closer = threading.Timer(2 * checkpoints.QUIET_WAIT_S, accepted.close)
        closer.start()
        began = time.monotonic()
        checkpoints.wait_quiet("env_x", {"127.0.0.3"})  # no CheckpointUnsupported
        assert time.monotonic() - began >= 2 * checkpoints.QUIET_WAIT_S
        closer.join()
    finally:
        accepted.close()
        server.close()
