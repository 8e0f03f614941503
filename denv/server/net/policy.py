"""Network policy of an env: the Docker network it gets and the host guard for egress deny.

Egress ``deny`` puts an env on an internal Docker network whose bridge is named ``dvd`` +
12 hex characters. Docker already refuses to forward anything between an internal bridge
and any other interface (so no other env and no outside address is reachable), but it
leaves the host itself reachable on the bridge's gateway address: ``install_host_guard``
drops every NEW connection that arrives on a ``dvd+`` bridge (iptables and ip6tables
INPUT). Replies to connections the host opens into a container are ESTABLISHED, so the
server still reaches the env (ingress proxy, health checks).

Egress ``allow`` uses a normal bridge named ``dva`` + 12 hex characters, an allowlist one
named ``dvl`` + 12 hex characters; ``firewall`` holds their rules.

    client.networks.create(**deny_network_options(env_id, labels))
    install_host_guard()   # once per server start; idempotent
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

DENY_BRIDGE_PREFIX = "dvd"
ALLOW_BRIDGE_PREFIX = "dva"
ALLOWLIST_BRIDGE_PREFIX = "dvl"
BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"
GUARD_COMMENT = "denv: egress-deny envs cannot connect to the host"
# The resolver of a deny env's containers. Docker's embedded DNS (127.0.0.11) still answers
# the env's own service names, but forwards every other name to this address inside the
# container, where nothing answers: no lookup leaves the env, whatever the host's resolvers.
DENY_DNS = ["127.0.0.1"]
_RULE = [
    "INPUT",
    "-i",
    DENY_BRIDGE_PREFIX + "+",
    "-m",
    "conntrack",
    "--ctstate",
    "NEW",
    "-m",
    "comment",
    "--comment",
    GUARD_COMMENT,
    "-j",
    "DROP",
]


class HostGuardError(RuntimeError):
    """The host guard could not be installed; deny envs would reach the host."""


def network_name(env_id: str) -> str:
    """The Docker network of an env: ``denv-<env id lowercased>``."""
    return f"denv-{env_id.lower()}"


def bridge_name(env_id: str, *, deny: bool, allowlist: bool = False) -> str:
    """``dvd``/``dva``/``dvl`` + 12 hex of sha256(env id): 15 characters, the Linux maximum."""
    prefix = DENY_BRIDGE_PREFIX if deny else ALLOW_BRIDGE_PREFIX
    if allowlist:
        prefix = ALLOWLIST_BRIDGE_PREFIX
    return prefix + hashlib.sha256(env_id.encode()).hexdigest()[:12]


def _network_options(env_id: str, labels: Mapping[str, str] | None, deny: bool) -> dict[str, Any]:
    return {
        "name": network_name(env_id),
        "driver": "bridge",
        "internal": deny,
        "check_duplicate": True,
        "options": {BRIDGE_NAME_OPTION: bridge_name(env_id, deny=deny)},
        "labels": dict(labels or {}),
    }


def deny_network_options(env_id: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments of ``docker.DockerClient.networks.create`` for an egress-deny env.

    An internal network (nothing forwarded in or out) on a ``dvd…`` bridge, which the host
    guard covers. ``client.networks.create(**deny_network_options(env_id, labels))``.
    """
    return _network_options(env_id, labels, deny=True)


def allow_network_options(env_id: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments of ``networks.create`` for an egress-allow env (``dva…`` bridge)."""
    return _network_options(env_id, labels, deny=False)


def _tools() -> list[str]:
    tools = [tool for tool in ("iptables", "ip6tables") if shutil.which(tool)]
    if "iptables" not in tools:
        raise HostGuardError(
            "iptables is not installed, so egress-deny envs could reach the host: "
            "install it (Debian: apt-get install iptables) and restart the server"
        )
    return tools


def _run(tool: str, action: str) -> subprocess.CompletedProcess[str]:
    # -w: wait for the xtables lock that dockerd may hold instead of failing at once.
    return subprocess.run(
        [tool, "-w", "5", action, *_RULE], capture_output=True, text=True, check=False
    )


def _present(tool: str) -> bool:
    return _run(tool, "-C").returncode == 0


@contextmanager
def host_lock() -> Iterator[None]:
    """A lock shared by every process on this machine (flock on a file under /run, else the
    temp dir): the check and the insert of the guard are two iptables calls, and two servers
    that both found it missing inserted it twice."""
    for base in ("/run", tempfile.gettempdir()):
        try:
            fd = os.open(os.path.join(base, "denv-host-guard.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            break
        except OSError:
            continue
    else:  # no place for a lock file: checking without one is still better than not at all
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def ensure_host_guard_on(tool: str) -> str:
    """Check the guard in one tool's INPUT chain and put it back if it is missing.

    Returns ``ok`` (it was there) or ``restored`` (it was missing and is back); raises
    ``HostGuardError`` naming the tool's message when it is missing and cannot be installed.
    The rule goes first in INPUT so that no ACCEPT rule can come before it.
    """
    with host_lock():  # every denv server on the machine checks: one inserts, not two
        if _present(tool):
            return "ok"
        result = _run(tool, "-I")
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
        raise HostGuardError(
            f"could not install the host guard ({tool}: {message}): egress-deny envs "
            "would reach the host; the server needs root or CAP_NET_ADMIN"
        )
    log.info("host guard installed (%s INPUT -i %s+ NEW DROP)", tool, DENY_BRIDGE_PREFIX)
    return "restored"


def install_host_guard() -> bool:
    """Drop NEW connections from ``dvd+`` bridges to the host (iptables and ip6tables).

    Idempotent. Returns True if it was missing from iptables (IPv4) and is now installed.
    An IPv4 failure raises ``HostGuardError``; an IPv6 one is logged here and reported by
    the server's health (``host_guard.ipv6: missing``), which checks the guard again.
    """
    installed = False
    for tool in _tools():
        try:
            state = ensure_host_guard_on(tool)
        except HostGuardError as exc:
            if tool == "iptables":
                raise
            log.error("%s", exc)
            continue
        installed = installed or (tool == "iptables" and state == "restored")
    return installed


def remove_host_guard() -> None:
    """Remove the host guard rule (every copy) from iptables and ip6tables; for tests."""
    for tool in _tools():
        while _present(tool):
            if _run(tool, "-D").returncode != 0:
                break


def host_guard_installed() -> bool:
    """Whether the IPv4 host guard rule is in place."""
    return _present("iptables")
