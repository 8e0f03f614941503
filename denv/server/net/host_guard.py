"""The host guard kept in place while the server runs, and its state for ``GET /v1/health``.

The host guard is every firewall rule of egress: the rule keeping egress-deny envs off the
host (``policy``) and the chains keeping egress-allow envs off the host, link-local and
private networks and allowlist envs on their allowlist (``firewall``). A firewall reload
(``iptables-restore``, firewalld, ufw) removes them silently. So the server checks them
every ``HOST_GUARD_CHECK_S`` and puts them back; health reports each family's last state
(``ok``, ``restored``: found missing and put back, ``missing``: could not be put back) with
how often it was restored and why it is missing. While a family is ``missing``, envs other
than egress-deny ones are refused (``egress_unsafe``): IPv6 is held to the rules of IPv4.

    watch = HostGuardWatch()
    watch.check()          # at start (raises if IPv4 cannot be guarded)
    asyncio.create_task(watch.forever(HOST_GUARD_CHECK_S))
    watch.status()         # {"ipv4": "ok", "ipv6": "ok", "restores": 0, ...}
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import shutil
import threading
from typing import Any

from denv.server.net.firewall import Firewall, FirewallError, resolvers
from denv.server.net.policy import HostGuardError, ensure_host_guard_on

log = logging.getLogger(__name__)

FAMILIES = {"ipv4": "iptables", "ipv6": "ip6tables"}


class HostGuardWatch:
    """The host guard's last known state per family; ``check`` refreshes and restores it."""

    def __init__(self, firewall: Firewall | None = None) -> None:
        self.firewall = firewall or Firewall(resolvers())
        self._lock = threading.Lock()
        self._states = dict.fromkeys(FAMILIES, "missing")
        self._reasons: dict[str, str] = {"ipv4": "not checked yet"}
        self._restores = 0
        self._last_restored_at: datetime.datetime | None = None
        self._checked = False

    def check(self) -> dict[str, str]:
        """Check both families, restore what is missing; raise if IPv4 stays unguarded."""
        states: dict[str, str] = {}
        reasons: dict[str, str] = {}
        for family, tool in FAMILIES.items():
            if shutil.which(tool) is None:
                states[family], reasons[family] = "missing", f"{tool} is not installed"
                continue
            try:
                states[family] = ensure_host_guard_on(tool)
                if self.firewall.ensure(tool):
                    states[family] = "restored"
            except HostGuardError as exc:
                states[family], reasons[family] = "missing", str(exc)
            except FirewallError as exc:
                states[family] = "missing"
                reasons[family] = (
                    f"the egress rules of allow and allowlist envs could not be installed "
                    f"({exc}); the server needs root or CAP_NET_ADMIN"
                )
        with self._lock:
            restored = [f for f, state in states.items() if state == "restored"]
            if not self._checked:
                # The first check installs the guard: that is a start, not a restore.
                states = {f: "ok" if state == "restored" else state for f, state in states.items()}
            elif restored:
                self._restores += 1
                self._last_restored_at = datetime.datetime.now(datetime.UTC)
                log.warning("host guard was missing (%s) and is restored", ", ".join(restored))
            for family, reason in reasons.items():
                if self._reasons.get(family) != reason:
                    log.error("host guard %s missing: %s", family, reason)
            self._states, self._reasons, self._checked = states, reasons, True
        if states["ipv4"] == "missing":
            raise HostGuardError(reasons["ipv4"])
        return states

    def egress_unsafe(self) -> str | None:
        """Why envs that may open connections (allow, allowlist) cannot be made now, or None.

        Egress-deny envs need only the host guard of IPv4 (their network is internal); the
        others need every family's rules, so IPv6 never leaks past what IPv4 refuses.
        """
        with self._lock:
            missing = [f for f, state in self._states.items() if state == "missing"]
            if not missing:
                return None
            why = "; ".join(f"{f}: {self._reasons.get(f, 'missing')}" for f in missing)
        return (
            f"the firewall rules of egress are missing for {', '.join(missing)} ({why}), so "
            "an env that may open connections could leak past them: use egress 'deny', or "
            "fix the firewall (GET /v1/health shows host_guard) and retry"
        )

    def status(self) -> dict[str, Any]:
        """What health reports: each family's state, restores since start, and why."""
        with self._lock:
            reason = "; ".join(f"{f}: {r}" for f, r in sorted(self._reasons.items())) or None
            restored_at = self._last_restored_at
            return {
                **self._states,
                "restores": self._restores,
                "last_restored_at": restored_at.isoformat() if restored_at else None,
                "reason": reason,
            }

    async def forever(self, interval_s: float) -> None:
        """``check`` every ``interval_s`` until cancelled; failures are logged, not raised."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.check)
            except HostGuardError:
                pass  # logged by check and reported by health
            except Exception:
                log.exception("host guard check failed")
