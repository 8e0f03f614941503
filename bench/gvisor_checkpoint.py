"""What this machine's runsc can checkpoint and restore (issue 45): a probe, not a feature.

    python -m bench.gvisor_checkpoint [--children 4] [--image denv-echo-env:latest]

Drives Debian's runsc (2022-12-19, `--platform=ptrace`) directly on OCI bundles, no Docker
runtime: the image's filesystem is exported once (`docker create` + `docker export`) and
every sandbox reads it read-only, with runsc's root dir under a temp dir. Three programs:

- ``echo_env``: OpenEnv's echo env (uvicorn, asyncio on epoll) under `--network=sandbox`,
  then `runsc checkpoint`; and once more under `--network=host`.
- ``http_server``: a stdlib `http.server.ThreadingHTTPServer` (poll, not epoll) under
  `--network=sandbox`, asked 3 times, checkpointed, then restored `--children` times, each
  into a new sandbox in a new network namespace with the same address inside; whether the
  restored server answers, with the token and the hit count the parent had.
- ``counter``: a Python loop printing a token drawn at start and a counter (and holding
  16 MB of random bytes) under `--network=none`: checkpointed and restored the same way;
  whether each child continues from the checkpointed memory (its token, its count).

Networking: each sandbox gets a network namespace ``S`` and a client namespace ``P``
joined by a veth pair (10.213.0.2 in S, 10.213.0.1 in P), so children can share the
inside address. runsc 2022-12 refuses `--network=sandbox` in any namespace that shows
/proc/sys/net/core/rmem_default (Linux 6.x shows it in every one), so sandboxes are
created as denv-runsc does: in a private mount namespace where that directory is an empty
tmpfs. runsc's control socket is an abstract socket in the namespace it ran in, so every
later runsc command for a sandbox runs in that sandbox's namespace.

What the runs showed besides the numbers: a checkpoint fails while a closed connection
lingers in TIME_WAIT ("endpoint cannot be saved in connected state"), and a failed checkpoint
stops the sandbox, so the probe checkpoints a server once, 65 s after its last request.
The echo env's first error is either that or "endpoint still has waiters upon save" (the
listener in epoll), whichever object runsc encodes first. `checkpoint --leave-running`
saves, then restores in place in the foreground and does not return, so the probe leaves it
out. A restored process's stdout keeps the parent's file offset (the child's file starts
with a hole of NUL bytes).

Results: bench/results/gvisor-checkpoint.json (timings, image sizes, exact errors).
Everything it makes (sandboxes, namespaces, veths, the temp dir) is removed at the end,
also on failure. Must run as root.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from .harness import write_json
from .measure import ROOT, conditions, machine

log = logging.getLogger("bench.gvisor_checkpoint")

RUNSC = os.environ.get("DENV_RUNSC", "/usr/bin/runsc")
PLATFORM = "ptrace"
INSIDE, OUTSIDE = "10.213.0.2", "10.213.0.1"
PORT = 8000
ANSWER_TIMEOUT_S = 60.0
TIME_WAIT_S = 65  # gVisor's netstack keeps a closed connection in TIME_WAIT for 60 s
RESULTS = ROOT / "bench" / "results" / "gvisor-checkpoint.json"

HTTP_SERVER = r"""
import http.server, json, os, threading
token, hits, lock = os.urandom(4).hex(), [0], threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with lock:
            hits[0] += 1
            body = json.dumps({"token": token, "hits": hits[0]}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
"""

COUNTER = r"""
import os, sys, time
token, ballast, i = os.urandom(4).hex(), os.urandom(16 << 20), 0
while True:
    print(token, i, flush=True)
    i += 1
    time.sleep(0.1)
"""


def run_cmd(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    log.debug("$ %s", " ".join(args))
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def condensed(error: str) -> str:
    """runsc's first line without the object dump: '...tcp.endpoint{...}: why'."""
    start, end = error.find("{"), error.rfind("}: ")
    return error if start < 0 or end < start else f"{error[:start]}{{...}}{error[end + 1 :]}"


def first_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The first non-empty line runsc printed on stderr (its error), else stdout's."""
    for text in (proc.stderr, proc.stdout):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return f"exit {proc.returncode}, no output"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True)


class Lab:
    """The temp dir, the exported rootfs, and every sandbox and namespace made: `close()`
    removes them all."""

    def __init__(self, image: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="denv-gvisor-ckpt-"))
        self.root = self.tmp / "runsc-root"
        self.root.mkdir()
        self.rootfs = self.tmp / "rootfs"
        self.tag = secrets.token_hex(3)
        self.netns: list[str] = []
        self.sandboxes: list[tuple[str, str]] = []  # (id, netns)
        self.config = json.loads(
            subprocess.run(
                ["docker", "image", "inspect", "-f", "{{json .Config}}", image],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        self._export(image)

    def _export(self, image: str) -> None:
        cid = subprocess.run(
            ["docker", "create", image], capture_output=True, text=True, check=True
        ).stdout.strip()
        try:
            self.rootfs.mkdir()
            t0 = time.perf_counter()
            export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
            subprocess.run(["tar", "-x", "-C", str(self.rootfs)], stdin=export.stdout, check=True)
            export.wait()
            log.info("exported %s in %.1f s", image, time.perf_counter() - t0)
        finally:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)

    def network(self, name: str, *, pair: bool) -> str:
        """A namespace S for a sandbox (and, with `pair`, a client namespace P on a veth
        with S: the same addresses every time); the path of S."""
        sandbox, client = f"gck-{self.tag}-{name}", f"gck-{self.tag}-{name}-c"
        ip("netns", "add", sandbox)
        self.netns.append(sandbox)
        ip("-n", sandbox, "link", "set", "lo", "up")
        if pair:
            ip("netns", "add", client)
            self.netns.append(client)
            ip("-n", sandbox, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
               "netns", client)  # fmt: skip
            for ns, dev, addr in ((sandbox, "eth0", INSIDE), (client, "peer0", OUTSIDE)):
                ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                ip("-n", ns, "link", "set", dev, "up")
                ip("-n", ns, "link", "set", "lo", "up")
        return f"/var/run/netns/{sandbox}"

    def bundle(self, name: str, args: list[str], netns: str) -> Path:
        """An OCI bundle running `args` on the read-only rootfs in namespace `netns`."""
        path = self.tmp / "bundles" / name
        path.mkdir(parents=True)
        subprocess.run([RUNSC, "spec", "--bundle", str(path)], check=True)
        spec = json.loads((path / "config.json").read_text())
        spec["root"] = {"path": str(self.rootfs), "readonly": True}
        spec["hostname"] = name
        process = spec["process"]
        process.update(terminal=False, args=args, cwd=self.config.get("WorkingDir") or "/")
        process["env"] = self.config.get("Env") or ["PATH=/usr/local/bin:/usr/bin:/bin"]
        namespaces = [n for n in spec["linux"]["namespaces"] if n["type"] != "network"]
        spec["linux"]["namespaces"] = [*namespaces, {"type": "network", "path": netns}]
        (path / "config.json").write_text(json.dumps(spec, indent=1))
        return path

    def runsc(self, netns: str, network: str, *args: str) -> list[str]:
        """runsc in `netns`, in a mount namespace where /proc/sys/net/core is empty."""
        return [
            "nsenter", f"--net={netns}", "unshare", "--mount", "--propagation", "private",
            "sh", "-c", 'mount -t tmpfs -o size=4k,mode=0555 none /proc/sys/net/core && exec "$@"',
            "sh", RUNSC, f"--root={self.root}", f"--platform={PLATFORM}", f"--network={network}",
            *args,
        ]  # fmt: skip

    def start(
        self, name: str, args: list[str], network: str, *, restore_from: Path | None = None
    ) -> dict[str, Any]:
        """`runsc run -detach` (or `restore -detach`) of `args` in new namespaces; timed."""
        netns = self.network(name, pair=network == "sandbox")
        bundle = self.bundle(name, args, netns)
        sid = f"gck-{self.tag}-{name}"
        verb = ["run"] if restore_from is None else ["restore", f"--image-path={restore_from}"]
        # Files, not pipes: the sandbox keeps runsc's stdio, and a pipe would never end.
        out = open(self.tmp / f"{name}.out", "w")  # noqa: SIM115 (the sandbox writes to it)
        err = open(self.tmp / f"{name}.err", "w+")  # noqa: SIM115
        self.sandboxes.append((sid, netns))  # before it runs: close() deletes it either way
        t0 = time.perf_counter()
        with out, err:
            code = subprocess.run(
                self.runsc(netns, network, *verb, "-detach", "-bundle", str(bundle), sid),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                timeout=180,
                check=False,
            ).returncode
            err.seek(0)
            said = err.read()
        elapsed = time.perf_counter() - t0
        found: dict[str, Any] = {"id": sid, "netns": netns, "s": elapsed, "ok": code == 0}
        if code != 0:
            found["error"] = next((ln.strip() for ln in said.splitlines() if ln.strip()), "")
        return found

    def checkpoint(self, sandbox: dict[str, Any], image: Path) -> dict[str, Any]:
        image.mkdir(parents=True)
        t0 = time.perf_counter()
        proc = run_cmd(
            ["nsenter", f"--net={sandbox['netns']}", RUNSC, f"--root={self.root}",
             "checkpoint", f"--image-path={image}", sandbox["id"]],
            timeout=300,
        )  # fmt: skip
        found: dict[str, Any] = {"s": time.perf_counter() - t0, "ok": proc.returncode == 0}
        if proc.returncode == 0:
            found["image_bytes"] = sum(f.stat().st_size for f in image.rglob("*") if f.is_file())
        else:
            found["error_first_line"] = first_error(proc)
            found["error"] = condensed(found["error_first_line"])
        return found

    def output(self, name: str) -> list[str]:
        return (self.tmp / f"{name}.out").read_text(errors="replace").splitlines()

    def close(self) -> None:
        for sid, netns in reversed(self.sandboxes):
            run_cmd(["nsenter", f"--net={netns}", RUNSC, f"--root={self.root}", "delete",
                     "-force", sid], timeout=60)  # fmt: skip
        for ns in reversed(self.netns):
            run_cmd(["ip", "netns", "del", ns])
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.sandboxes, self.netns = [], []


ASK = (
    "import sys, urllib.request; "
    "print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())"
)


def ask(netns: str, path: str = "/") -> dict[str, Any] | None:
    """GET http://INSIDE:PORT<path> from the client namespace paired with `netns`."""
    client = f"{netns}-c"
    proc = run_cmd(
        ["nsenter", f"--net={client}", sys.executable, "-c", ASK, f"http://{INSIDE}:{PORT}{path}"],
        timeout=10,
    )
    if proc.returncode != 0:
        return None
    try:
        found: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        return {"text": proc.stdout.strip()[:200]}
    return found


def wait_answer(netns: str, path: str, since: float) -> dict[str, Any]:
    """Seconds from `since` until the server in `netns` answers `path`, and the answer."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while time.monotonic() < deadline:
        answer = ask(netns, path)
        if answer is not None:
            return {"answered": True, "s": time.perf_counter() - since, "answer": answer}
        time.sleep(0.1)
    return {"answered": False, "error": f"no answer in {ANSWER_TIMEOUT_S:.0f} s"}


def probe_echo(lab: Lab) -> dict[str, Any]:
    """OpenEnv's echo env: checkpoint under network=sandbox, then under network=host."""
    args = [*(lab.config.get("Entrypoint") or []), *(lab.config.get("Cmd") or [])]
    out: dict[str, Any] = {"args": args}
    for network in ("sandbox", "host"):
        name = f"echo-{network}"
        t0 = time.perf_counter()
        sandbox = lab.start(name, args, network)
        row: dict[str, Any] = {"run": sandbox}
        if sandbox["ok"] and network == "sandbox":
            row["ready"] = wait_answer(sandbox["netns"], "/health", t0)
        elif sandbox["ok"]:
            time.sleep(5)  # no client path into a host-network sandbox here: let it boot
        if sandbox["ok"]:
            checkpoint(lab, sandbox, lab.tmp / "images" / name, row, wait=network == "sandbox")
        out[f"network_{network}"] = row
        log.info("echo env, network=%s: %s", network, _said(row))
    return out


def checkpoint(
    lab: Lab, sandbox: dict[str, Any], image: Path, out: dict[str, Any], *, wait: bool = True
) -> None:
    """`out["checkpoint"]`, TIME_WAIT_S after the last request: the requests' connections
    linger in TIME_WAIT (the server closed them) and runsc refuses to save a connection
    ("endpoint cannot be saved in connected state"); a failed checkpoint stops the
    sandbox, so there is one try."""
    if wait:
        time.sleep(TIME_WAIT_S)
        out["waited_s"] = TIME_WAIT_S
    out["checkpoint"] = lab.checkpoint(sandbox, image)


def _said(row: dict[str, Any]) -> str:
    ck = row.get("checkpoint") or {}
    if not row.get("run", {}).get("ok"):
        return f"did not start: {row.get('run', {}).get('error')}"
    if ck.get("ok"):
        return f"checkpoint {ck['s']:.2f} s, {ck['image_bytes'] / 2**20:.1f} MB"
    return f"checkpoint failed: {ck.get('error')}"


def restore_children(
    lab: Lab, name: str, image: Path, args: list[str], network: str, n: int
) -> list[dict[str, Any]]:
    """`n` restores of `image`, each a new sandbox in new namespaces, one after another."""
    children = []
    for k in range(n):
        child = f"{name}-child{k}"
        t0 = time.perf_counter()
        row = lab.start(child, args, network, restore_from=image)
        if row["ok"] and network == "sandbox":
            row["first_answer"] = wait_answer(row["netns"], "/", t0)
        children.append(row)
        log.info("%s: restore %.2f s (%s)", child, row["s"], row.get("error") or "ok")
    return children


def probe_http_server(lab: Lab, n: int) -> dict[str, Any]:
    args = ["python3", "-c", HTTP_SERVER]
    t0 = time.perf_counter()
    parent = lab.start("http", args, "sandbox")
    out: dict[str, Any] = {"run": parent}
    if not parent["ok"]:
        return out
    out["ready"] = wait_answer(parent["netns"], "/", t0)
    before = [ask(parent["netns"]) for _ in range(2)]
    out["answers_before"] = before
    image = lab.tmp / "images" / "http"
    checkpoint(lab, parent, image, out)
    log.info("http.server: %s", _said(out))
    if out["checkpoint"]["ok"]:
        out["children"] = restore_children(lab, "http", image, args, "sandbox", n)
    return out


def probe_counter(lab: Lab, n: int) -> dict[str, Any]:
    args = ["python3", "-c", COUNTER]
    parent = lab.start("counter", args, "none")
    out: dict[str, Any] = {"run": parent}
    if not parent["ok"]:
        return out
    time.sleep(3)
    image = lab.tmp / "images" / "counter"
    out["checkpoint"] = lab.checkpoint(parent, image)
    lines = lab.output("counter")
    out["parent_last_line"] = lines[-1] if lines else None
    log.info("counter: %s; last line %s", _said(out), out["parent_last_line"])
    if not out["checkpoint"]["ok"]:
        return out
    children = restore_children(lab, "counter", image, args, "none", n)
    out["children"] = children
    time.sleep(2)
    token, _, count = (out["parent_last_line"] or " -1").partition(" ")
    for k, child in enumerate(children):
        # The restored stdout keeps the parent's file offset: the child's file starts with
        # that many NUL bytes (a sparse hole), then its own lines.
        said = [ln.lstrip("\0") for ln in lab.output(f"counter-child{k}")]
        child["first_line"] = said[0] if said else None
        child["lines_after_2s"] = len(said)
        if said:
            t, _, c = said[0].partition(" ")
            child["continues"] = t == token and int(c) == int(count) + 1
    return out


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gvisor_checkpoint", description=__doc__)
    parser.add_argument("--children", type=int, default=4, help="restores of each checkpoint")
    parser.add_argument("--image", default="denv-echo-env:latest")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if os.geteuid() != 0:
        parser.error("runs runsc, ip netns and nsenter directly: run it as root")
    version = run_cmd([RUNSC, "--version"]).stdout.strip().splitlines()
    result: dict[str, Any] = {
        "benchmark": "gvisor-checkpoint",
        "runsc": version[0] if version else "unknown",
        "platform": PLATFORM,
        "image": args.image,
        "children": args.children,
        "machine": machine(),
        "conditions": {"before": conditions()},
    }
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)  # so that close() runs
    lab = Lab(args.image)
    try:
        probes: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("echo_env", lambda: probe_echo(lab)),
            ("http_server", lambda: probe_http_server(lab, args.children)),
            ("counter", lambda: probe_counter(lab, args.children)),
        ]
        for part, probe in probes:
            try:
                result[part] = probe()
            except Exception as exc:
                log.exception("%s failed", part)
                result[part] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        lab.close()
    result["conditions"]["after"] = conditions()
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    write_json(args.out, result)
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
