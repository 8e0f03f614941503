"""Host-side helpers shared by the probes: the probe container, its control socket, pids, memory.

Everything stays on this machine: containers on a probe network, addresses on its bridge.

Not run on its own: the probes beside it import it (``from common import ...``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
IMAGE = "denv-echo-env:latest"
IP_FORMAT = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
PREFIX = "lfp-"  # every container, network and directory a probe makes starts with this


def sh(*args: str, check: bool = True) -> str:
    return subprocess.run(args, check=check, capture_output=True, text=True).stdout.strip()


def start_server(name: str, *extra: str, network: str = "bridge") -> dict[str, Any]:
    """The echo server under forkserver.py, hardened as denv runs envs (no capability,
    no-new-privileges, Docker's default seccomp) unless ``extra`` says otherwise."""
    ctl = Path(tempfile.mkdtemp(prefix=PREFIX + "ctl-"))
    os.chmod(ctl, 0o777)
    args = [
        "docker", "run", "-d", "--name", PREFIX + name, "--network", network,
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "-v", f"{HERE}:/probe:ro", "-v", f"{ctl}:/ctl", "-w", "/app",
        *extra, IMAGE, "python", "/probe/forkserver.py",
    ]  # fmt: skip
    cid = sh(*args)
    ip = sh(
        "docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", cid
    )
    pid = int(sh("docker", "inspect", "-f", "{{.State.Pid}}", cid))
    wait_http(ip, 8000, "/health", 60)
    return {"cid": cid, "ip": ip, "pid": pid, "ctl": ctl}


def stop_server(srv: dict[str, Any]) -> None:
    sh("docker", "rm", "-f", srv["cid"], check=False)
    shutil.rmtree(srv["ctl"], ignore_errors=True)


def ctl(srv: dict[str, Any], req: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(srv["ctl"] / "ctl.sock"))
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError("control socket closed")
            buf += chunk
    return dict(json.loads(buf))


def call(ip: str, port: int, path: str, body: Any = None, timeout: float = 2) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        if body is None:
            conn.request("GET", path)
        else:
            data = json.dumps(body)
            conn.request("POST", path, data, {"content-type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode(errors="replace")
    finally:
        conn.close()


def wait_http(ip: str, port: int, path: str, timeout: float, every: float = 0.0005) -> float:
    """Seconds until ``GET path`` answers 200 (polled every ``every`` s)."""
    t0 = time.perf_counter()
    while True:
        with contextlib.suppress(OSError, http.client.HTTPException):
            if call(ip, port, path, timeout=0.5)[0] == 200:
                return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{ip}:{port}{path} not ready after {timeout} s")
        time.sleep(every)


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                kids = Path(f"/proc/{p}/task/{task}/children").read_text().split()
                for k in kids:
                    out.append(int(k))
                    todo.append(int(k))
    return out


def host_pid(container_pid: int, ns_pid: int) -> int:
    """The host pid of the process that is ``ns_pid`` inside the container."""
    for p in [container_pid, *descendants(container_pid)]:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("NSpid:") and int(line.split()[-1]) == ns_pid:
                    return p
    raise LookupError(ns_pid)


def private_kb(pid: int) -> dict[str, int]:
    """smaps_rollup of ``pid``: Rss, Pss and Private_* in kB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty"):
            out[key] = int(value.split()[0])
    out["Private"] = out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)
    return out


def kill(pids: list[int]) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, 9)


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def write_result(name: str, result: dict[str, Any]) -> None:
    result["machine"] = {
        "kernel": os.uname().release,
        "cores": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = HERE / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
