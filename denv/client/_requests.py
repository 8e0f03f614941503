"""Request bodies and pages of the generated client, as the facade builds and reads them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

from denv_api_client.models import Egress as ApiEgress
from denv_api_client.models import EgressAllowlist as ApiEgressAllowlist
from denv_api_client.models import EnvsCreate, EnvVars, Labels
from denv_api_client.models import WaitFor as ApiWaitFor
from denv_api_client.types import UNSET, Unset

from . import _config
from .types import Egress, EgressAllowlist, EnvStatus, WaitFor

# "deny", "allow", or an allowlist: {"allow": ["name-or-cidr[:port]", ...]}
EgressArg = Literal["deny", "allow"] | Egress | EgressAllowlist | Mapping[str, Sequence[str]]
WaitArg = Literal["none", "running", "healthy"] | WaitFor
UntilArg = Literal["running", "healthy", "deleted"]
StatusArg = Literal["creating", "starting", "running", "healthy", "failed", "deleted"] | EnvStatus

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
R = TypeVar("R")


class Secret(str):
    """A string whose repr does not show it (the generated client's attrs repr shows its token)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"'{_config.API_KEY_PREFIX}***'"


def opt(value: Any) -> Any:
    """None → UNSET, so the server applies the contract's default."""
    return UNSET if value is None else value


def labels_body(labels: Mapping[str, str] | None) -> Labels | Unset:
    return UNSET if labels is None else Labels.from_dict(dict(labels))


def env_vars_body(env: Mapping[str, str] | None) -> EnvVars | Unset:
    return UNSET if env is None else EnvVars.from_dict(dict(env))


def egress_body(egress: EgressArg) -> ApiEgress | ApiEgressAllowlist:
    """A mode, or an allowlist given as ``EgressAllowlist`` or ``{"allow": [...]}``."""
    if isinstance(egress, EgressAllowlist):
        return ApiEgressAllowlist(allow=list(egress.allow))
    if isinstance(egress, Mapping):
        entries = egress.get("allow")
        if set(egress) != {"allow"} or isinstance(entries, str) or entries is None:
            raise ValueError(
                f"egress {dict(egress)!r}: an allowlist is {{'allow': ['name-or-cidr[:port]', "
                "...]}, e.g. {'allow': ['host.docker.internal:8100']}"
            )
        return ApiEgressAllowlist(allow=[str(e) for e in entries])
    return ApiEgress(str(egress))


def wait_body(wait: WaitArg) -> ApiWaitFor:
    return ApiWaitFor(str(wait))


def new_idempotency_key() -> str:
    return f"denv-{uuid.uuid4()}"


class Page(Protocol[T_co]):
    @property
    def items(self) -> Sequence[T_co]: ...
    @property
    def next_cursor(self) -> str | None: ...


def paginate(fetch: Callable[[str | Unset], Page[T]], convert: Callable[[T], R]) -> Iterator[R]:
    """Items of every page, following `next_cursor`; a page is fetched when it is reached."""
    cursor: str | Unset = UNSET
    while True:
        page = fetch(cursor)
        yield from (convert(item) for item in page.items)
        if not page.next_cursor:
            return
        cursor = page.next_cursor


def envs_create(
    count: int,
    egress: EgressArg | None,
    env: Mapping[str, str] | None,
    labels: Mapping[str, str] | None,
    ttl_s: int | None,
    wait: WaitArg,
    wait_timeout_s: float | None,
    warm: int,
) -> EnvsCreate:
    """The body of a fork or of envs from a version."""
    return EnvsCreate(
        count=count,
        egress=UNSET if egress is None else egress_body(egress),
        env=env_vars_body(env),
        labels=labels_body(labels),
        ttl_s=opt(ttl_s),
        wait=wait_body(wait),
        wait_timeout_s=opt(wait_timeout_s),
        warm=warm,
        kind=UNSET,  # a fork's kind is set by the fork call, and sent only when not volume
        live=UNSET,  # envs from a version: set by that call, and sent only when asked
        reseed=UNSET,  # a live fork's: sent only when False (the server's default is True)
    )
