"""What a facade operation is (``denv.client._operations``): a ``Call`` (one API call,
ready to send, and how its answer becomes the facade's value), a ``Listing`` (a list, one page
a call) or a ``Plan`` (several calls, each on the answer before), and what the operations
share to build them."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar

from denv_api_client.models import LiveAuto
from denv_api_client.types import UNSET, Response, Unset

from . import _config
from ._http import unwrap
from ._requests import Page, WaitArg
from .types import Env

ForkKind = Literal["volume", "live", "auto"]
LiveArg = bool | Literal["auto"]

T = TypeVar("T")


class Operation(Protocol):
    """A generated operation module (`denv_api_client.api.<tag>.<operation>`)."""

    @property
    def sync_detailed(self) -> Callable[..., Response[Any]]: ...
    @property
    def asyncio_detailed(self) -> Callable[..., Any]: ...


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call, ready to send; `result` turns its answer into the facade's value.

    `wait_s`: how long the server may rightly wait before answering (a long-poll), added to
    the client's timeout; `idempotent=True` marks a POST that is safe to retry. `holds=True`:
    the call creates envs, which the client's lease holds (its body gets the `lease_id`).
    """

    operation: Operation
    result: Callable[[Response[Any]], T]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    wait_s: float | None = None
    idempotent: bool | None = None
    holds: bool = False


@dataclass(frozen=True)
class Listing(Generic[T]):
    """A list, one page a call: `page(cursor, limit)`, each item turned by `convert`."""

    page: Callable[[str | Unset, int], Call[Page[Any]]]
    convert: Callable[[Any], T]


#: Several calls, each depending on the answer before it (see `denv.client._lineage`): a
#: generator that yields each call, is sent its value (or thrown its error), and returns `T`.
Plan: TypeAlias = Generator[Call[Any], Any, T]


def value(convert: Callable[[Any], T]) -> Callable[[Response[Any]], T]:
    return lambda res: convert(unwrap(res))


def page_of(res: Response[Any]) -> Page[Any]:
    page: Page[Any] = unwrap(res)
    return page


def create_wait_s(wait: WaitArg, wait_timeout_s: float | None) -> float | None:
    """A create that waits for its envs is a long-poll of `wait_timeout_s`."""
    if str(wait) == "none":
        return None
    return wait_timeout_s if wait_timeout_s is not None else _config.DEFAULT_CREATE_WAIT_TIMEOUT_S


def live_body(live: LiveArg) -> bool | LiveAuto | Unset:
    """`live` as sent: only when asked (older servers know no `live`)."""
    if live == "auto":
        return LiveAuto.AUTO
    if live is True:
        return True
    if live is False:
        return UNSET
    raise ValueError(f"live must be True, False or 'auto', not {live!r}")


def envs_of(res: Response[Any]) -> list[Env]:
    return [Env.from_api(env) for env in unwrap(res).envs]
