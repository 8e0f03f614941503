"""The firewall of egress ``allow`` and allowlist envs: iptables and ip6tables, kept in place.

What the rules are (two chains per family, the generic rules and each env's) is
``egress_rules``; this module applies them: it reads the chains with ``iptables -S``, writes
rules with ``iptables-restore`` (one transaction each time) and puts back what went missing.

Several servers may share one machine: the generic rules are the same for all of them and
each server adds and removes only the per-env rules of its own envs. ``ensure`` puts back
what a firewall reload removed (the host guard's watch calls it every few seconds).

    firewall = Firewall(resolvers())
    firewall.ensure("iptables")                 # chains, jumps, generic rules
    firewall.add_env(tools(), "dvl0123456789ab", [EnvRule(dest="10.1.2.3/32", port=8000)])
    firewall.remove_env(tools(), "dvl0123456789ab")
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from denv.server.net.egress_rules import (
    ALLOW_PREFIX,
    ALLOWLIST_PREFIX,
    ENV_TAG,
    FWD_CHAIN,
    GENERIC_TAG,
    IN_CHAIN,
    TABLE,
    EnvRule,
    env_rules,
    generic_rules,
    jumps,
    render,
)

log = logging.getLogger(__name__)

_RESTORE = {"iptables": "iptables-restore", "ip6tables": "ip6tables-restore"}
ENSURE_ATTEMPTS = 3  # a transaction that raced another server's is read again and retried


class FirewallError(RuntimeError):
    """A rule could not be read or written (no root, no iptables, a refused rule)."""


def tools() -> list[str]:
    """The iptables tools this host has, IPv4's first."""
    return [tool for tool in ("iptables", "ip6tables") if shutil.which(tool)]


def resolvers(path: str = "/etc/resolv.conf") -> list[str]:
    """The host's nameservers Docker's embedded DNS forwards to (loopback ones excluded:
    Docker replaces those with public resolvers)."""
    found: list[str] = []
    try:
        text = Path(path).read_text()
    except OSError:
        return found
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                address = ipaddress.ip_address(words[1].split("%")[0])
            except ValueError:
                continue
            if not address.is_loopback:
                found.append(str(address))
    return found


class Firewall:
    """The chains of both families, their generic rules and this server's per-env rules."""

    def __init__(self, resolver_addresses: list[str]) -> None:
        self._resolvers = resolver_addresses
        self._lock = threading.Lock()
        self._envs: dict[str, list[EnvRule]] = {}  # bridge -> rules, this server's envs

    # the generic part
    def generic(self, tool: str) -> dict[str, list[list[str]]]:
        """The generic rules of each chain, in order, for one tool."""
        return generic_rules(tool, self._resolvers)

    def ensure(self, tool: str) -> bool:
        """Chains, jumps, generic rules and this server's env rules in place for one tool.

        Returns True if anything was missing and is now back; raises ``FirewallError``.
        Other servers on the machine run the same check: a transaction that lost a race
        (a rule it deletes was deleted a moment ago) is read again and retried.
        """
        with self._lock:
            changed = False
            _drop_legacy(tool)
            for chain in (IN_CHAIN, FWD_CHAIN):
                if not _has_chain(tool, chain):
                    _run(tool, [*_t(chain), "-N", chain], check=False)  # another server may
                    if not _has_chain(tool, chain):  # make it first
                        _run(tool, [*_t(chain), "-N", chain])  # raises with the tool's message
                    changed = True
            for parent, jump in jumps():
                table = _t(jump[-1])
                if _run(tool, [*table, "-C", parent, *jump], check=False).returncode != 0:
                    _run(tool, [*table, "-I", parent, "1", *jump])
                    changed = True
            for attempt in range(ENSURE_ATTEMPTS):
                lines = self._missing_lines(tool)
                if not lines:
                    break
                try:
                    _restore(tool, lines)
                    changed = True
                    break
                except FirewallError:
                    if attempt == ENSURE_ATTEMPTS - 1:
                        raise
                    time.sleep(0.05 * (attempt + 1))
            stale = _stale_lines(tool)
            if stale:
                try:
                    _restore(tool, stale)
                except FirewallError as exc:  # another server removed them first: fine
                    log.debug("stale egress rules not removed here: %s", exc)
            return changed

    def _missing_lines(self, tool: str) -> list[str]:
        """The restore lines that put the generic rules and this server's env rules back.

        Each chain is read once (``-S``), however many envs the server has."""
        seen = {chain: _chain_lines(tool, chain) for chain in (IN_CHAIN, FWD_CHAIN)}
        lines: list[str] = []
        for chain, rules in self.generic(tool).items():
            present = _with_tag(seen[chain], GENERIC_TAG)
            wanted = [_canonical(tool, chain, rule) for rule in rules]
            if present != wanted:
                lines += ["-D" + line[2:] for line in present]
                lines += [render("-A", chain, rule) for rule in rules]
        for bridge, bridge_rules in self._envs.items():
            lines += self._env_lines(tool, bridge, bridge_rules, seen=seen)
        return lines

    # per-env rules
    def _env_rules(
        self, tool: str, bridge: str, rules: list[EnvRule]
    ) -> list[tuple[str, list[str]]]:
        return env_rules(tool, bridge, rules)

    def _env_lines(
        self,
        tool: str,
        bridge: str,
        rules: list[EnvRule],
        *,
        seen: dict[str, list[str]] | None = None,
        fresh: bool = False,
    ) -> list[str]:
        """Restore lines that give ``bridge`` exactly its rules: none when they are all there.

        ``seen``: the chains as read (else read here); ``fresh``: a bridge just made, which
        has no rules yet (nothing to read)."""
        wanted = self._env_rules(tool, bridge, rules)
        if not fresh:
            seen = seen or {c: _chain_lines(tool, c) for c in (IN_CHAIN, FWD_CHAIN)}
            by_chain = {c: _with_tag(seen[c], f"{ENV_TAG} {bridge}") for c in (IN_CHAIN, FWD_CHAIN)}
            if all(
                len(by_chain[c]) == sum(1 for chain, _ in wanted if chain == c)
                for c in (IN_CHAIN, FWD_CHAIN)
            ):
                return []
            lines = ["-D" + line[2:] for chain in by_chain.values() for line in chain]
        else:
            lines = []
        return lines + [render("-I", chain, ["1", *rule]) for chain, rule in reversed(wanted)]

    def add_env(
        self, tools: list[str], bridge: str, rules: list[EnvRule], *, fresh: bool = False
    ) -> None:
        """Let ``bridge`` reach ``rules`` (an allowlist) or everything (a ``dva`` bridge).

        Idempotent: rules already in place are left, a partial set is replaced; the bridge
        is remembered, so ``ensure`` puts its rules back after a firewall reload.
        """
        with self._lock:
            self._envs[bridge] = list(rules)
            for tool in tools:
                lines = self._env_lines(tool, bridge, rules, fresh=fresh)
                if lines:
                    _restore(tool, lines)

    def remove_env(self, tools: list[str], bridge: str) -> None:
        """Drop every rule of ``bridge`` (any server's), e.g. once its network is gone."""
        with self._lock:
            self._envs.pop(bridge, None)
            for tool in tools:
                lines = [
                    "-D" + line[2:]
                    for chain in (IN_CHAIN, FWD_CHAIN)
                    for line in _tagged(tool, chain, f"{ENV_TAG} {bridge}")
                ]
                if lines:
                    try:
                        _restore(tool, lines)
                    except FirewallError as exc:
                        log.warning("could not remove the rules of %s: %s", bridge, exc)


def _run(tool: str, args: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(
            [tool, "-w", "5", *args], capture_output=True, text=True, check=False
        )
    except OSError as exc:
        raise FirewallError(f"{tool} could not run: {exc}") from exc
    if check and result.returncode != 0:
        message = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
        raise FirewallError(f"{tool} {' '.join(args)}: {message}")
    return result


def _stale_lines(tool: str) -> list[str]:
    """``-D`` lines for per-env rules whose bridge is gone (its env was removed without us:
    a server that died, or a cleanup that removed its network directly)."""
    stale: list[str] = []
    for chain in (IN_CHAIN, FWD_CHAIN):
        for line in _tagged_prefix(tool, chain, ENV_TAG + " "):
            bridge = line.split(f'"{ENV_TAG} ', 1)[1].split('"', 1)[0]
            if not Path("/sys/class/net", bridge).exists():
                stale.append("-D" + line[2:])
    return stale


def _tagged_prefix(tool: str, chain: str, prefix: str) -> list[str]:
    result = _run(tool, [*_t(chain), "-S", chain], check=False)
    return (
        [
            line
            for line in result.stdout.splitlines()
            if line.startswith("-A ") and f'"{prefix}' in line
        ]
        if result.returncode == 0
        else []
    )


def _t(chain: str) -> list[str]:
    return ["-t", TABLE.get(chain, "filter")]


def _drop_legacy(tool: str) -> None:
    """Remove the filter-table ``DENV-EGRESS-FWD`` of earlier versions (jumped to from
    ``DOCKER-USER``/``FORWARD``): its catch-all rules would refuse what an allowlist allows."""
    if _run(tool, ["-t", "filter", "-S", FWD_CHAIN], check=False).returncode != 0:
        return
    for parent in ("DOCKER-USER", "FORWARD"):
        for prefix in (ALLOW_PREFIX, ALLOWLIST_PREFIX):
            jump = ["-i", prefix + "+", "-j", FWD_CHAIN]
            for _ in range(8):  # every copy
                if _run(tool, ["-t", "filter", "-D", parent, *jump], check=False).returncode:
                    break
    _run(tool, ["-t", "filter", "-F", FWD_CHAIN], check=False)
    _run(tool, ["-t", "filter", "-X", FWD_CHAIN], check=False)


def _has_chain(tool: str, chain: str) -> bool:
    return _run(tool, [*_t(chain), "-S", chain], check=False).returncode == 0


def _chain_lines(tool: str, chain: str) -> list[str]:
    """The ``-A`` lines of ``chain`` (none if it does not exist)."""
    result = _run(tool, [*_t(chain), "-S", chain], check=False)
    if result.returncode != 0:
        return []
    return [line for line in result.stdout.splitlines() if line.startswith("-A ")]


def _with_tag(lines: list[str], tag: str) -> list[str]:
    return [line for line in lines if f'"{tag}"' in line]


def _tagged(tool: str, chain: str, tag: str) -> list[str]:
    """The ``-A`` lines of ``chain`` carrying exactly the comment ``tag``, in order."""
    result = _run(tool, [*_t(chain), "-S", chain], check=False)
    if result.returncode != 0:
        return []
    return [
        line for line in result.stdout.splitlines() if line.startswith("-A ") and f'"{tag}"' in line
    ]


_CANONICAL: dict[tuple[str, str, str], str] = {}


def _canonical(tool: str, chain: str, rule: list[str]) -> str:
    """How ``iptables -S`` prints a rule (it reorders matches), learned once per rule.

    Learned by writing the rule to a scratch chain and reading it back.
    """
    key = (tool, chain, render("-A", chain, rule))
    if key not in _CANONICAL:
        scratch = f"DENV-EGRESS-S{os.getpid()}"  # one per server: several may share the host
        table = _t(chain)  # the table matters: REJECT is valid in filter only
        _run(tool, [*table, "-N", scratch], check=False)
        try:
            _run(tool, [*table, "-F", scratch])
            _run(tool, [*table, "-A", scratch, *rule])
            printed = [
                ln
                for ln in _run(tool, [*table, "-S", scratch]).stdout.splitlines()
                if ln.startswith("-A ")
            ]
        finally:
            _run(tool, [*table, "-F", scratch], check=False)
            _run(tool, [*table, "-X", scratch], check=False)
        _CANONICAL[key] = printed[0].replace(f"-A {scratch} ", f"-A {chain} ", 1)
    return _CANONICAL[key]


def _restore(tool: str, lines: list[str]) -> None:
    """Apply ``lines`` (``-A``/``-I``/``-D``; each chain's table) in one transaction."""
    by_table: dict[str, list[str]] = {}
    for line in lines:
        by_table.setdefault(TABLE.get(line.split()[1], "filter"), []).append(line)
    script = "".join(
        f"*{table}\n" + "\n".join(table_lines) + "\nCOMMIT\n"
        for table, table_lines in by_table.items()
    )
    try:
        result = subprocess.run(
            [_RESTORE[tool], "-w", "5", "--noflush"],
            input=script,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        raise FirewallError(f"{_RESTORE[tool]} could not run: {exc}") from exc
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
        raise FirewallError(f"{_RESTORE[tool]}: {message}")
