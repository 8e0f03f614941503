"""Forkable volumes: overlayfs over immutable layers, mounted on the host, bind-mounted in.

Layout under the state dir: ``layers/<layer_id>/`` (immutable) and
``envs/<env_id>/<service>/<n>/{disk.img,fs/{upper,work},mnt}``. ``mnt`` is first made a shared
mount point of its own (bind onto itself, make-shared) so that the container's ``rslave`` bind
sees mounts made on it later; the overlay is then mounted on it. ``fs`` holds what the env
changes: with a size (``--max-volume-mb``) it is an ext4 of that size in ``disk.img``
(``filesystems``), so writes past it fail with ENOSPC inside the env; without one, a plain dir.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from denv.server import ids
from denv.server.config import LAYER_DEPTH_LIMIT
from denv.server.volumes.filesystems import VolumeFs, drain_pool
from denv.server.volumes.mounts import (
    MS_BIND,
    MS_NODEV,
    MS_NOSUID,
    MS_SHARED,
    mount,
    mount_points_under,
    unmount_all,
)
from denv.server.volumes.rootfs import ROOT, RootFs

log = logging.getLogger(__name__)

EMPTY_LAYER = "empty"


def _run(*args: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OSError(f"{' '.join(args)} failed: {proc.stderr.strip() or proc.returncode}")


def mount_overlay(opts: str, target: Path) -> None:
    """``mount -t overlay overlay -o nosuid,nodev,opts target``.

    An env's volume is its own to write: a setuid binary or a device node it leaves there
    (or a layer seeded from an image carries) is inert on the host and in every fork.
    """
    mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV, opts)


def make_shared_mount_point(path: Path) -> None:
    """``mount --bind path path; mount --make-shared path``."""
    mount(str(path), path, None, MS_BIND, None)
    mount("none", path, None, MS_SHARED, None)


class Volumes:
    """Makes, mounts, snapshots and merges volume layers under one state dir."""

    def __init__(self, state_dir: Path, size_mb: int = 0) -> None:
        self.layers_dir = state_dir / "layers"
        self.envs_dir = state_dir / "envs"
        self.rootfs = RootFs(self.envs_dir)  # live children's root filesystems
        # What each volume may change, enforced by a filesystem of its own; 0: unlimited.
        # Pooled filesystems of an earlier run (with sizes or not, this one starts empty).
        drain_pool(state_dir / "volfs")
        self.fs = VolumeFs(state_dir / "volfs", size_mb) if size_mb > 0 else None
        self.layers_dir.mkdir(parents=True, exist_ok=True)
        self.envs_dir.mkdir(parents=True, exist_ok=True)
        (self.layers_dir / EMPTY_LAYER).mkdir(exist_ok=True)

    def layer_path(self, layer_id: str) -> Path:
        return self.layers_dir / layer_id

    def env_dir(self, env_id: str) -> Path:
        return self.envs_dir / env_id

    def new_layer_dir(self) -> tuple[str, Path]:
        """A fresh, not yet published layer dir; :meth:`publish` makes it visible."""
        layer_id = ids.new_id("lyr")
        tmp = self.layers_dir / f".tmp-{layer_id}"
        tmp.mkdir()
        return layer_id, tmp

    def publish(self, layer_id: str, tmp: Path) -> None:
        os.rename(tmp, self.layer_path(layer_id))

    def mount(self, env_id: str, service: str, n: int, layers: list[str]) -> Path:
        """Mount one volume (layers newest first) and return its ``mnt`` dir."""
        mnt = self.prepare(env_id, service, n)
        self.attach(env_id, service, n, layers)
        return mnt

    def prepare(self, env_id: str, service: str, n: int) -> Path:
        """Make a volume's dirs and its ``mnt`` a shared mount point, still empty.

        A container bound to ``mnt`` (``rslave``) sees the overlay :meth:`attach` mounts
        later: this is how a booted warm spare gets a fork's volume.
        """
        base = self.envs_dir / env_id / service / str(n)
        mnt = base / "mnt"
        self._disk(base)
        mnt.mkdir(parents=True, exist_ok=True)
        for d in (base / "fs" / "upper", base / "fs" / "work"):
            d.mkdir(parents=True, exist_ok=True)
        make_shared_mount_point(mnt)
        return mnt

    def attach(self, env_id: str, service: str, n: int, layers: list[str]) -> None:
        """Mount the overlay of ``layers`` (newest first) and a fresh upper dir on ``mnt``."""
        base = self.envs_dir / env_id / service / str(n)
        lowers = [str(self.layer_path(x)) for x in layers] or [str(self.layer_path(EMPTY_LAYER))]
        fs = base / "fs"
        opts = f"lowerdir={':'.join(lowers)},upperdir={fs / 'upper'},workdir={fs / 'work'}"
        mount_overlay(opts, base / "mnt")

    def live_dir(self, env_id: str) -> Path:
        """A live env's slot dir (``envs/<id>/live``), a shared mount point, bound at
        ``/.denv/work`` in its container: each live child's volumes are mounted here."""
        path = self.envs_dir / env_id / "live"
        path.mkdir(parents=True, exist_ok=True)
        if str(path.resolve()) not in mount_points_under(path):
            make_shared_mount_point(path)
        return path

    def attach_live(
        self, group: str, slot: str, env_id: str, service: str, n: int, layers: list[str]
    ) -> None:
        """Mount a live child's volume at ``live/<slot>/work-<n>`` in its group's live dir,
        and make ``live/<slot>/kids``, where its own children's slots will be mounted."""
        base = self.envs_dir / env_id / service / str(n)
        self._disk(base)
        fs = base / "fs"
        for d in (fs / "upper", fs / "work"):
            d.mkdir(parents=True, exist_ok=True)
        home = self.envs_dir / group / "live" / slot
        (home / "kids").mkdir(parents=True, exist_ok=True)
        target = home / f"work-{n}"
        target.mkdir(exist_ok=True)
        lowers = [str(self.layer_path(x)) for x in layers] or [str(self.layer_path(EMPTY_LAYER))]
        opts = f"lowerdir={':'.join(lowers)},upperdir={fs / 'upper'},workdir={fs / 'work'}"
        mount_overlay(opts, target)

    def _disk(self, base: Path) -> None:
        """Make a volume's dir ``base``, with its own filesystem on ``base/fs`` when sizes
        are enforced: a pooled one when there is one, else a new one."""
        if self.fs is not None:
            base.parent.mkdir(parents=True, exist_ok=True)
            if self.fs.take(base):
                return
            base.mkdir(exist_ok=True)
            self.fs.make(base / "disk.img", base / "fs")
        else:
            base.mkdir(parents=True, exist_ok=True)

    def detach_live(self, group: str, slot: str, env_id: str) -> None:
        """Unmount a live env's volumes and root filesystem (``rootfs``) from its group's
        live dir (a child has binds of its own of them) and remove its volume dirs; its
        children's slots stay."""
        home = self.envs_dir / group / "live" / slot if slot else None
        if home is not None and home.is_dir():
            targets = [*home.glob("work-*"), *home.glob(ROOT)]
            unmount_all(*targets)
            for target in targets:
                with contextlib.suppress(OSError):
                    target.rmdir()
            with contextlib.suppress(OSError):
                (home / "kids").rmdir()
                home.rmdir()
        if env_id != group:
            self.remove_env(env_id)

    def upper(self, env_id: str, service: str, n: int) -> Path:
        """The dir holding what the env changed in a volume (the overlay's upper dir)."""
        return self.envs_dir / env_id / service / str(n) / "fs" / "upper"

    def mnt(self, env_id: str, service: str, n: int) -> Path:
        """The volume's mount point, bound into the service's container."""
        return self.envs_dir / env_id / service / str(n) / "mnt"

    def remove_env(self, env_id: str) -> None:
        """Unmount and delete everything an env's volumes had (a live group's: its children's
        volumes and root filesystems too)."""
        self.rootfs.forget(env_id)
        root = self.env_dir(env_id)
        if root.exists():
            if self.fs is not None:
                # Each volume's own filesystem goes back to the pool once its overlay is off.
                bases = [disk.parent for disk in root.glob("*/*/disk.img")]
                unmount_all(*(base / "mnt" for base in bases))
                for base in bases:
                    self.fs.give_back(base)
            unmount_all(root)
            shutil.rmtree(root, ignore_errors=True)

    def capture(self, upper: Path) -> str | None:
        """Copy an upper dir into a new layer (whiteouts and xattrs kept); None when empty."""
        if not upper.is_dir() or not any(upper.iterdir()):
            return None
        layer_id, tmp = self.new_layer_dir()
        _run("cp", "-a", f"{upper}/.", str(tmp))
        self.publish(layer_id, tmp)
        return layer_id

    def stack(self, new_layer: str | None, parent_layers: list[str]) -> list[str]:
        """The layer stack of a new version's volume, merged into one past the depth limit."""
        layers = ([new_layer] if new_layer else []) + parent_layers
        if len(layers) <= LAYER_DEPTH_LIMIT:
            return layers
        return [self.merge(layers)]

    def merge(self, layers: list[str]) -> str:
        """One layer with the content of a whole stack (a read-only overlay, copied)."""
        layer_id, tmp = self.new_layer_dir()
        view = self.layers_dir / f".merge-{layer_id}"
        view.mkdir()
        lowers = ":".join(str(self.layer_path(x)) for x in layers)
        try:
            _run("mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={lowers}", str(view))
            try:
                _run("cp", "-a", f"{view}/.", str(tmp))
            finally:
                _run("umount", str(view))
        finally:
            view.rmdir()
        self.publish(layer_id, tmp)
        return layer_id

    def delete_layers(self, layer_ids: set[str]) -> None:
        for layer_id in layer_ids:
            if layer_id != EMPTY_LAYER and layer_id.startswith("lyr_"):
                shutil.rmtree(self.layer_path(layer_id), ignore_errors=True)

    def layer_size(self, layer_id: str) -> int:
        """Bytes of disk a layer's files use (0: not here, or the shared empty layer)."""
        if not layer_id.startswith("lyr_") or "/" in layer_id:
            return 0
        return disk_usage(self.layer_path(layer_id), stop_after=2**62)

    def free_bytes(self) -> int:
        """Bytes free to unprivileged writers on the disk of the layers dir."""
        st = os.statvfs(self.layers_dir)
        return st.f_bavail * st.f_frsize

    def layer_ids(self) -> set[str]:
        return {p.name for p in self.layers_dir.iterdir() if p.name.startswith("lyr_")}

    def clean_tmp(self) -> None:
        """Drop half-made layers left by a server that died mid-snapshot."""
        _kill_orphan_copies(f"{self.layers_dir}/.")
        for p in self.layers_dir.iterdir():
            if p.name.startswith(".merge-"):
                unmount_all(p)
            if p.name.startswith((".tmp-", ".merge-")):
                shutil.rmtree(p, ignore_errors=True)


def disk_usage(root: Path, stop_after: int) -> int:
    """Bytes of disk the files under ``root`` use; counting stops once past ``stop_after``."""
    total = 0
    stack = [str(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:  # removed meanwhile, or not a directory
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if total > stop_after:
                    return total
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total


def _kill_orphan_copies(prefix: str, wait_s: float = 5.0) -> None:
    """SIGKILL processes whose arguments name a path under ``prefix``, and wait for them.

    A server killed (-9) mid-snapshot leaves its ``cp -a`` running; it would keep writing
    into the half-made layer that the next server is about to remove.
    """
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.decode(errors="replace").startswith(prefix) for arg in argv):
            log.info("killing %s left running by a server that died: %s", proc.name, argv[:3])
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)
                pids.append(int(proc.name))
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _alive(pid)]
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Running, not a zombie (nobody may reap an orphan)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
