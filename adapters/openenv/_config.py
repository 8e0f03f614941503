"""A DenvProvider's settings: one frozen value, checked once, copied whole by its forks."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from denv.types import EgressAllowlist

#: "deny", "allow", or an allowlist: `{"allow": ["name-or-cidr[:port]", ...]}` / `EgressAllowlist`
Egress = Literal["deny", "allow"] | EgressAllowlist | Mapping[str, Sequence[str]]

#: `volume`: children boot from a snapshot of /work; `live`: children are copies of the
#: running server process (memory, sessions); `auto`: live where the image allows it.
ForkKind = Literal["volume", "live", "auto"]
#: The container port an OpenEnv server listens on unless told otherwise.
DEFAULT_PORT = 8000
#: Keyword arguments of start_container besides image/port/env_vars: what OpenEnv itself passes
#: (AutoEnv's `wait_timeout`) and the per-start options other providers take.
START_OPTIONS = ("wait_timeout", "labels", "command", "cmd")


@dataclass(frozen=True)
class ProviderConfig:
    """What a `DenvProvider` was made with (see its docstring); forks carry the same one.

    `warm_fork` is resolved (`warm > 0` when not given) and `labels` is read-only.
    """

    server: str | None = None
    api_key: str | None = field(default=None, repr=False)  # never shown
    image: str | None = None
    egress: Egress = "deny"  # a dict allowlist is kept as an EgressAllowlist
    ttl_s: int = 3600
    labels: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0
    warm: int = 0
    warm_fork: bool | None = None
    websocket: bool = True
    fork: ForkKind = "auto"
    pull: bool = False
    detach: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "egress", _egress(self.egress))
        if self.fork not in ("volume", "live", "auto"):
            raise ValueError(f"fork must be 'volume', 'live' or 'auto', not {self.fork!r}")
        if self.ttl_s < 1:
            raise ValueError(f"ttl_s must be at least 1 second, not {self.ttl_s!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {self.timeout_s!r}")
        if self.warm < 0:
            raise ValueError(f"warm must be 0 or more, not {self.warm!r}")
        # Frozen: assignments in __post_init__ go through object.__setattr__.
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        if self.warm_fork is None:
            object.__setattr__(self, "warm_fork", self.warm > 0)

    def sandbox_options(
        self, port: int | None, env_vars: Mapping[str, str] | None, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The keyword arguments of `create_sandbox` for a start of this provider (the sync
        and the async start send the same), `live` aside."""
        wait_timeout = options.get("wait_timeout")
        return {
            "ports": [port or DEFAULT_PORT],
            "env": dict(env_vars) if env_vars else None,
            "egress": self.egress,
            "command": command_list(options.get("command", options.get("cmd"))),
            "labels": self.merged_labels(options.get("labels")),
            "ttl_s": self.ttl_s,
            "wait": "running",
            "wait_timeout_s": float(wait_timeout or self.timeout_s),
            "warm": self.warm,
            "warm_fork": bool(self.warm_fork),
            "pull": self.pull,
        }

    def live_start(self) -> bool | Literal["auto"]:
        """The `live` of a start: `auto` keeps an env whose server cannot be copied (its forks
        are then volume forks); `live` wants it refused; `volume` starts without the launcher."""
        if self.fork == "auto":
            return "auto"
        return self.fork == "live"

    def volume_fallback(self, code: str | None) -> bool:
        """Whether a live start refused with `code` starts again for volume forks."""
        return self.fork == "auto" and code == "live_unsupported"

    def fork_kind(self, kind: ForkKind | None) -> ForkKind:
        """The kind of a fork: the call's, else the provider's."""
        return kind or self.fork

    def merged_labels(self, extra: Mapping[str, str] | None = None) -> dict[str, str] | None:
        """The provider's labels with `extra` on top; None when there are none."""
        labels = {**self.labels, **(extra or {})}
        return labels or None


def _egress(egress: object) -> Literal["deny", "allow"] | EgressAllowlist:
    """A mode, or an allowlist (a dict `{"allow": [...]}` becomes an `EgressAllowlist`)."""
    if egress == "deny" or egress == "allow":
        return "deny" if egress == "deny" else "allow"
    if isinstance(egress, EgressAllowlist):
        return egress
    if isinstance(egress, Mapping) and set(egress) == {"allow"}:
        entries = egress["allow"]
        if not isinstance(entries, str) and isinstance(entries, Sequence) and entries:
            return EgressAllowlist(allow=tuple(str(e) for e in entries))
    raise ValueError(
        f"egress must be 'deny', 'allow' or an allowlist such as "
        f"{{'allow': ['host.docker.internal:8100']}}, not {egress!r}"
    )


def check_start_options(options: Mapping[str, object]) -> None:
    """Refuse keyword arguments start_container() does not know (a typo must not pass)."""
    unknown = sorted(set(options) - set(START_OPTIONS))
    if unknown:
        raise ValueError(
            "DenvProvider.start_container() got unknown keyword argument(s): "
            f"{', '.join(unknown)}; it accepts image, port, env_vars, "
            f"{', '.join(START_OPTIONS)}"
        )


def command_list(value: Sequence[str] | str | None) -> list[str] | None:
    """A start command as a list (a string is split as a shell would)."""
    if value is None:
        return None
    if isinstance(value, str):
        return shlex.split(value)
    return [str(part) for part in value]
