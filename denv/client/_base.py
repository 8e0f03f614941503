"""How a `Denv` or an `AsyncDenv` reaches its server, and how `Denv` runs one operation.

The server is found on first use (no I/O in the constructor), one pooled connection is
kept, and it is closed once. Each client runs the operations of `denv.client._operations` its own
way: `Denv` with the generated `sync_detailed` (here), `AsyncDenv` awaiting
`asyncio_detailed` (`denv.client._async_base`); what both are given (`ClientSettings`) is here.
A call that creates envs (`Call.holds`) first opens the client's lease, once, and sends its
id (`denv.client._lease` renews it; closing the client closes it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Self, TypeVar, cast

import attrs
import httpx
from denv_api_client.client import AuthenticatedClient

from . import _config
from . import _operations as ops
from ._http import api_client, build_http_client, tls_verify
from ._lease import LeaseKeeper, renew_timeout_s
from ._operations import Call, Listing
from ._requests import Secret, paginate
from ._retry import call_options
from .errors import DenvError, LeaseExpired
from .local import resolve_server
from .types import Lease

T = TypeVar("T")


class ClientSettings:
    """What both clients are given: where the server is, the key, timeouts and retries;
    their lease's bookkeeping."""

    def __init__(
        self,
        server: str | None,
        api_key: str | None,
        *,
        timeout_s: float,
        max_retries: int,
        ca_bundle: str | os.PathLike[str] | None = None,
        detach: bool = False,
        lease_id: str | None = None,
        lease_timeout_s: float | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be 0 or more, not {max_retries!r}")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._ca_bundle = ca_bundle  # read on first use: tls_verify
        self._page_size = _config.LIST_PAGE_SIZE
        # The server is found on first use, so constructing a client does no I/O.
        self._server_arg = server
        self._key_arg = None if api_key is None else Secret(api_key)
        self._server: str | None = None
        self._client: AuthenticatedClient | None = None
        self._closed = False
        self._key: Secret | None = None  # the resolved key, for the lease keeper's client
        # The lease (denv.client._lease): none with `detach`; another client's with `lease_id`
        # (this one neither renews nor closes it); else this client's own, opened on the
        # first create.
        self._detach = detach
        self._lease_given = lease_id
        self._lease_timeout_s = lease_timeout_s
        self._keeper: LeaseKeeper | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(server={self._server or self._server_arg!r})"

    def _options(self, call: Call[Any]) -> AbstractContextManager[None]:
        """A long-poll may rightly wait `call.wait_s` before answering: that, plus `timeout_s`."""
        read_timeout_s = None if call.wait_s is None else call.wait_s + self.timeout_s
        return call_options(read_timeout_s=read_timeout_s, idempotent=call.idempotent)

    def _closed_error(self) -> RuntimeError:
        return RuntimeError(f"this {type(self).__name__} client is closed")

    @property
    def lease_id(self) -> str | None:
        """The id of the lease holding this client's envs: its own once its first create
        opened it, the one it was given (`lease_id=`), or None (`detach=True`, or nothing
        created yet)."""
        if self._lease_given is not None:
            return self._lease_given
        return None if self._keeper is None else self._keeper.lease_id

    def _keeper_for(self, lease: Lease, server: str) -> LeaseKeeper:
        """The renewals of a lease just opened, on a sync client of their own (an
        `AsyncDenv`'s loop is never involved)."""
        assert self._key is not None
        http = build_http_client(
            server,
            self._key,
            timeout_s=renew_timeout_s(lease.timeout_s),
            max_retries=0,
            transport=self._lease_transport(),
            verify=tls_verify(self._ca_bundle),
        )
        return LeaseKeeper(
            lease.id, lease.timeout_s, http, api_client(server, self._key).set_httpx_client(http)
        )

    def _lease_transport(self) -> httpx.BaseTransport | None:
        return None

    def _with_lease(self, call: Call[T], lease_id: str | None) -> Call[T]:
        """`call` with the lease's id in its body (nothing is sent without a lease)."""
        if lease_id is None:
            return call
        body = attrs.evolve(call.kwargs["body"], lease_id=lease_id)
        return Call(
            call.operation,
            call.result,
            call.args,
            {**call.kwargs, "body": body},
            call.wait_s,
            call.idempotent,
            call.holds,
        )

    @property
    def lease_ended(self) -> bool:
        """Whether the server ended this client's own lease (its next create would raise
        `LeaseExpired`)."""
        return self._keeper is not None and self._keeper.lost is not None

    def _lease_ended(self, exc: LeaseExpired) -> None:
        if self._keeper is not None:
            self._keeper.note(exc)


class ClientBase(ClientSettings):
    """The connection half of `Denv` (its calls are in `denv.client._client`)."""

    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = _config.DEFAULT_TIMEOUT_S,
        max_retries: int = _config.DEFAULT_MAX_RETRIES,
        ca_bundle: str | os.PathLike[str] | None = None,
        detach: bool = False,
        lease_id: str | None = None,
        lease_timeout_s: float | None = None,
        _transport: httpx.BaseTransport | None = None,
        _sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            server,
            api_key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            ca_bundle=ca_bundle,
            detach=detach,
            lease_id=lease_id,
            lease_timeout_s=lease_timeout_s,
        )
        self._transport = _transport
        self._sleep = _sleep
        self._lock = threading.Lock()
        self._lease_lock = threading.Lock()

    @classmethod
    def from_environment(
        cls,
        server: str | None = None,
        api_key: str | None = None,
        *,
        start_local: bool = False,
        timeout_s: float = _config.DEFAULT_TIMEOUT_S,
        max_retries: int = _config.DEFAULT_MAX_RETRIES,
    ) -> Self:
        """A client whose server is found now rather than on first use (see `denv.local`).

        With `start_local=True` and no server configured, the local server is started when
        none answers. Raises `DenvConfigError` when no server or key is found.

        >>> denv = Denv.from_environment(start_local=True)
        """
        url, key = resolve_server(server, api_key, start=start_local)
        return cls(url, key, timeout_s=timeout_s, max_retries=max_retries)

    @property
    def server(self) -> str:
        """The server's base URL (found on first use: argument, DENV_SERVER, local server)."""
        self._api  # noqa: B018  (finds the server)
        assert self._server is not None
        return self._server

    @property
    def _api(self) -> AuthenticatedClient:
        """The generated client, built on first use (see `denv.local.resolve_server`)."""
        with self._lock:
            if self._client is None:
                if self._closed:  # once built, httpx itself refuses calls after close
                    raise self._closed_error()
                server, key = resolve_server(self._server_arg, self._key_arg)
                self._key = Secret(key)
                http = build_http_client(
                    server,
                    Secret(key),
                    timeout_s=self.timeout_s,
                    max_retries=self.max_retries,
                    transport=self._transport,
                    sleep=self._sleep,
                    verify=tls_verify(self._ca_bundle),
                )
                self._client = api_client(server, Secret(key)).set_httpx_client(http)
                self._server = server
            return self._client

    def _call(self, call: Call[T]) -> T:
        if call.holds:
            call = self._with_lease(call, self._lease())
        try:
            with self._options(call):
                res = call.operation.sync_detailed(*call.args, client=self._api, **call.kwargs)
            return call.result(res)
        except LeaseExpired as exc:
            self._lease_ended(exc)
            raise

    def _lease(self) -> str | None:
        """The lease new envs go under: this client's own is opened on first use."""
        if self._detach or self._lease_given is not None:
            return self._lease_given
        with self._lease_lock:
            if self._keeper is None:
                lease = self._call(ops.open_lease(self._lease_timeout_s))
                self._keeper = self._keeper_for(lease, self.server)
            return self._keeper.check()

    def _lease_transport(self) -> httpx.BaseTransport | None:
        return self._transport  # a test's stand-in network carries the renewals too

    def lease(self) -> Lease | None:
        """This client's lease as the server has it now (opened if it was not yet); None
        with `detach=True`.

        >>> denv.lease().state, denv.lease().envs   # ('open', 33)
        """
        lease_id = self._lease()
        return None if lease_id is None else self._call(ops.get_lease(lease_id))

    def hold_lease(self) -> str | None:
        """The id of the lease this client's envs go under, opened now if it was not yet
        (one request, where `lease()` also reads it back); None with `detach=True`.
        `LeaseExpired` once the server ended it."""
        return self._lease()

    def _run(self, plan: Generator[Call[Any], Any, T]) -> T:
        """Run a plan of several calls (see `._lineage`): send each its value or error."""
        step = next(plan)
        while True:
            try:
                value = self._call(step)
            except DenvError as exc:
                try:
                    step = plan.throw(exc)
                except StopIteration as done:
                    return cast(T, done.value)
                continue
            try:
                step = plan.send(value)
            except StopIteration as done:
                return cast(T, done.value)

    def _list(self, listing: Listing[T]) -> Iterator[T]:
        return paginate(
            lambda cursor: self._call(listing.page(cursor, self._page_size)), listing.convert
        )

    def close(self) -> None:
        """Close the client's lease (the server deletes the envs it holds, at once; detached
        envs stay), then the connection pool. The client is unusable afterwards."""
        with self._lock:
            self._closed = True
            client = self._client
        if self._keeper is not None:
            self._keeper.close()
        if client is not None:
            client.get_httpx_client().close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
