"""Does Docker's userns-remap work with denv's volumes (overlay on the host, late mount)?

    .venv/bin/python -m bench.userns_remap [--out bench/results] [--runs 3]

Runs two private dockerds in turn (each with its own socket, data root, exec root and a
bridge of its own, never `--bridge=none`; no iptables), one plain and one with
`--userns-remap=nobody:nogroup` (a range `nobody:100000:65536` is added to /etc/subuid
and /etc/subgid for the run and removed after), loads the
stand-in image into each and points a private `denv serve` at it (DOCKER_HOST). On each
it measures a cold start of a stand-in env (whose command writes /work/seed.txt, then
serves HTTP), whether the env's root can write /work, a snapshot, and a warm fork (a
spare's late mount seen inside the running container). Writes ``<out>/userns.json`` and
prints the runs; asserts nothing. Everything it made is removed at the end (daemons,
bridges, data roots, the subuid lines).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from .measure import ROOT, machine, now_iso

log = logging.getLogger("bench.userns")

IMAGE = "denv-http-standin:latest"
COMMAND = [
    "sh",
    "-c",
    "echo seeded > /work/seed.txt; exec python3 -m http.server 8000 --directory /srv/www",
]
# Docker turns user namespaces off for `--userns-remap=root` ("root cannot be remapped with
# itself"), so the remap user is `nobody:nogroup`, existing ones: nothing is added to
# /etc/passwd or /etc/group.
REMAP_USER, REMAP_GROUP = "nobody", "nogroup"
SUB_IDS = {
    "/etc/subuid": f"{REMAP_USER}:100000:65536",
    "/etc/subgid": f"{REMAP_USER}:100000:65536",  # dockerd looks both up by the user's name
}


class Daemon:
    """A private dockerd: its own socket, roots and bridge."""

    def __init__(self, root: Path, remap: bool) -> None:
        self.root, self.remap = root, remap
        self.host = f"unix://{root / 'docker.sock'}"
        self.bridge = f"dvu{os.getpid() % 100000}{int(remap)}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)
        args = [
            *("dockerd", "--host", self.host, "--data-root", str(self.root / "data")),
            *("--exec-root", str(self.root / "exec"), "--pidfile", str(self.root / "pid")),
            *("--iptables=false", "--ip-masq=false", f"--bridge={self.bridge}"),
            *([f"--userns-remap={REMAP_USER}:{REMAP_GROUP}"] if self.remap else []),
        ]
        log_file = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 (the daemon holds it)
        self.proc = subprocess.Popen(args, stdout=log_file, stderr=log_file, start_new_session=True)
        log_file.close()
        deadline = time.monotonic() + 60
        while self.docker("info", check=False) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "dockerd.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"the private dockerd did not start:\n{tail}")
            time.sleep(0.3)

    def docker(self, *args: str, check: bool = True) -> str | None:
        done = subprocess.run(
            ["docker", "-H", self.host, *args], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            if check:
                raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.strip()}")
            return None
        return done.stdout

    def load(self, image: str) -> None:
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", self.host, "load"], stdin=save.stdout, check=True,
                       capture_output=True)  # fmt: skip
        save.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for cid in (self.docker("ps", "-aq", check=False) or "").split():
                self.docker("rm", "-f", cid, check=False)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        _unmount_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    prefix = str(root) + "/"
    for _ in range(5):
        with open("/proc/self/mountinfo") as f:
            points = [ln.split()[4] for ln in f if ln.split()[4].startswith(prefix)]
        if not points:
            return
        for p in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", p], capture_output=True, check=False)


class Server:
    """A private `denv serve` on a daemon."""

    def __init__(self, state: Path, daemon: Daemon) -> None:
        self.state = state
        state.mkdir(parents=True, exist_ok=True)
        out = open(state / "server.out", "ab")  # noqa: SIM115 (the server holds it)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "denv.server", "--port", "0", "--state-dir", str(state)],
            stdout=out,
            stderr=out,
            env={**os.environ, "DOCKER_HOST": daemon.host, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        out.close()
        deadline = time.monotonic() + 60
        while not (state / "server.json").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((state / "server.out").read_text(errors="replace")[-2000:])
            time.sleep(0.1)
        self.url = json.loads((state / "server.json").read_text())["url"]
        key = (state / "api_key").read_text().strip()
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=300
        )

    def call(self, method: str, path: str, **kw: Any) -> Any:
        res = self.http.request(method, path, **kw)
        if res.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {res.status_code} {res.text}")
        return res.json() if res.content else None

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        _unmount_under(self.state)


def _exec(daemon: Daemon, env_id: str, script: str) -> tuple[int, str]:
    name = f"denv-{env_id.lower()}-agent"
    done = subprocess.run(
        ["docker", "-H", daemon.host, "exec", name, "sh", "-c", script],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).strip()


def measure(root: Path, remap: bool, runs: int) -> dict[str, Any]:
    daemon = Daemon(root / ("remap" if remap else "plain"), remap)
    out: dict[str, Any] = {"userns_remap": remap}
    server: Server | None = None
    try:
        daemon.start()
        daemon.load(IMAGE)
        server = Server(daemon.root / "state", daemon)
        info = daemon.docker("info", "--format", "{{json .SecurityOptions}}") or ""
        out["security_options"] = json.loads(info or "[]")
        body = {"image": IMAGE, "command": COMMAND, "wait": "healthy", "warm": 2, "warm_fork": True}
        starts, envs = [], []
        for _ in range(runs):
            t0 = time.perf_counter()
            env = server.call("POST", "/v1/sandboxes", json=body)
            starts.append(time.perf_counter() - t0)
            envs.append(env)
            out.setdefault("status", env["status"])
        out["cold_start_s"] = starts
        out["cold_start_median_s"] = statistics.median(starts)
        env_id = envs[0]["id"]
        out["seed_written_by_command"] = _exec(daemon, env_id, "cat /work/seed.txt")
        out["root_writes_work"] = _exec(daemon, env_id, "echo x > /work/new && echo ok")
        out["work_owner_inside"] = _exec(daemon, env_id, "stat -c '%u:%g %a' /work")
        upper = daemon.root / "state" / "envs" / env_id / "agent" / "0" / "fs" / "upper"
        out["upper_owner_on_host"] = f"{upper.stat().st_uid}:{upper.stat().st_gid}"
        if remap:
            # What a remap-aware denv would do: give the upper dir to the remapped root.
            base = 100000
            os.chown(upper, base, base)
            out["upper_shifted_to"] = f"{base}:{base}"
            out["root_writes_work_after_shift"] = _exec(
                daemon, env_id, "echo x > /work/new && stat -c '%u:%g' /work/new"
            )
        t0 = time.perf_counter()
        version = server.call("POST", f"/v1/envs/{env_id}/snapshot")
        out["snapshot_s"] = time.perf_counter() - t0
        deadline = time.monotonic() + 120
        while server.call("GET", f"/v1/envs/{env_id}/warm")["state"] not in ("ready", "stalled"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        t0 = time.perf_counter()
        fork = server.call("POST", f"/v1/envs/{env_id}/fork", json={"count": 1, "wait": "healthy"})
        out["fork_s"] = time.perf_counter() - t0
        child = fork["envs"][0]
        out["fork_start"] = child["start"]
        out["fork_child_sees_new"] = _exec(daemon, child["id"], "cat /work/new")
        out["fork_child_writes"] = _exec(daemon, child["id"], "echo y > /work/y && echo ok")
        out["fork_child_modifies_parents_file"] = _exec(
            daemon, child["id"], "echo z >> /work/new && echo ok"
        )
        out["version"] = version["id"]
        if remap:
            out["shifted_before_mount"] = _shifted_before_mount(daemon, 100000)
    except Exception as exc:  # a finding, not a crash: the table says what failed
        out["error"] = f"{type(exc).__name__}: {exc}"
        log.exception("userns measurement (remap=%s) failed", remap)
    finally:
        if server is not None:
            for env in server.call("GET", "/v1/envs").get("items", []):
                server.http.delete(f"/v1/envs/{env['id']}")
            server.stop()
        daemon.stop()
    return out


def _shifted_before_mount(daemon: Daemon, base: int) -> dict[str, Any]:
    """denv's design by hand, with the upper dir given to the remapped root before the
    overlay is mounted: a container bound (rslave) to an empty shared mount point, the
    overlay mounted there after it started (the late mount of a warm fork), then a write."""
    from denv.server.volumes.overlay import make_shared_mount_point, mount_overlay

    root = daemon.root / "by-hand"
    lower, upper, work, mnt = (root / d for d in ("lower", "upper", "work", "mnt"))
    for d in (lower, upper, work, mnt):
        d.mkdir(parents=True)
    (lower / "seeded-by-root").write_text("seed\n")  # owned by the host's root
    os.chown(upper, base, base)
    make_shared_mount_point(mnt)
    name = f"denv-userns-{os.getpid()}"
    found: dict[str, Any] = {}
    try:
        daemon.docker(
            "run", "-d", "--name", name, "--mount",
            f"type=bind,source={mnt},target=/work,bind-propagation=rslave",
            IMAGE, "sleep", "300",
        )  # fmt: skip
        mount_overlay(f"lowerdir={lower},upperdir={upper},workdir={work}", mnt)

        def run(script: str) -> tuple[int, str]:
            done = subprocess.run(
                ["docker", "-H", daemon.host, "exec", name, "sh", "-c", script],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            return done.returncode, (done.stdout + done.stderr).strip()

        found["work_owner_inside"] = run("stat -c '%u:%g' /work")
        found["root_writes_work"] = run("echo x > /work/new && stat -c '%u:%g' /work/new")
        found["host_owner_of_new"] = (
            f"{(upper / 'new').stat().st_uid}:{(upper / 'new').stat().st_gid}"
            if (upper / "new").exists()
            else None
        )
        found["seed_owner_inside"] = run("stat -c '%u:%g' /work/seeded-by-root")
        found["root_modifies_seed"] = run("echo more >> /work/seeded-by-root && echo ok")
    finally:
        daemon.docker("rm", "-f", name, check=False)
        _unmount_under(root)
    return found


def _with_subids() -> list[Path]:
    added = []
    for name, line in SUB_IDS.items():
        path = Path(name)
        text = path.read_text() if path.exists() else ""
        if not any(ln.split(":")[0] == line.split(":")[0] for ln in text.splitlines()):
            with path.open("a") as f:
                f.write(line + "\n")
            added.append(path)
    return added


def _remove_subids(paths: list[Path]) -> None:
    for path in paths:
        mine = SUB_IDS[str(path)]
        lines = [ln for ln in path.read_text().splitlines() if ln != mine]
        path.write_text("".join(ln + "\n" for ln in lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.userns_remap")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="plain,remap", help="plain, remap or both")
    parser.add_argument("--root", type=Path, default=Path(f"/tmp/denv-userns-{os.getpid()}"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    added = _with_subids()
    try:
        modes = args.modes.split(",")
        results = [measure(args.root, m == "remap", args.runs) for m in modes]
    finally:
        _remove_subids(added)
        shutil.rmtree(args.root, ignore_errors=True)
    payload = {"benchmark": "userns", "date": now_iso(), "machine": machine(), "runs": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "userns.json").write_text(json.dumps(payload, indent=2) + "\n")
    for r in results:
        print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
