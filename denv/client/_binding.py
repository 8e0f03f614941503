"""The facades' methods, bound from the operations: `get_env = sync_call(ops.get_env)`.

An operation of `denv.client._operations` (or a plan, `denv.client._lineage`) holds the
public signature and docstring; a binder makes it a method of `Denv` (run by
`ClientBase._call`, `_list` or `_run`) or of `AsyncDenv` (awaited, lists async iterators).
The binders are typed with the operation's parameters (`ParamSpec`), so mypy checks a user's
call against them; `help()`, `inspect.signature` and `typing.get_type_hints` show the
operation's parameters after `self` and what the facade returns (`Env`, not `Call[Env]`).
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

from ._async_base import AsyncClientBase
from ._base import ClientBase
from ._operations import Call, Listing, Plan

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C", bound=type)


# -- Denv


def sync_call(op: Callable[P, Call[T]]) -> Callable[Concatenate[ClientBase, P], T]:
    def method(self: ClientBase, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._call(op(*args, **kwargs))

    return _shown_as(op, method)


def sync_list(op: Callable[P, Listing[T]]) -> Callable[Concatenate[ClientBase, P], Iterator[T]]:
    def method(self: ClientBase, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._list(op(*args, **kwargs))

    return _shown_as(op, method, Iterator)


def sync_plan(plan: Callable[P, Plan[T]]) -> Callable[Concatenate[ClientBase, P], T]:
    def method(self: ClientBase, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(plan(*args, **kwargs))

    return _shown_as(plan, method)


# -- AsyncDenv


def async_call(
    op: Callable[P, Call[T]],
) -> Callable[Concatenate[AsyncClientBase, P], Coroutine[Any, Any, T]]:
    async def method(self: AsyncClientBase, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._call(op(*args, **kwargs))

    return _shown_as(op, method)


def async_list(
    op: Callable[P, Listing[T]],
) -> Callable[Concatenate[AsyncClientBase, P], AsyncIterator[T]]:
    # Not a coroutine: the list is an async iterator, fetched only as it is iterated.
    def method(self: AsyncClientBase, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        return self._list(op(*args, **kwargs))

    return _shown_as(op, method, AsyncIterator)


def async_plan(
    plan: Callable[P, Plan[T]],
) -> Callable[Concatenate[AsyncClientBase, P], Coroutine[Any, Any, T]]:
    async def method(self: AsyncClientBase, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(plan(*args, **kwargs))

    return _shown_as(plan, method)


# -- what help() and inspect see


def facade(cls: C) -> C:
    """The class decorator of a facade: its bound methods take its names
    (`Denv.create_sandbox`, module `denv.client._client`), as methods written in it have."""
    for name, member in vars(cls).items():
        if inspect.isfunction(member) and hasattr(member, "__wrapped__"):
            member.__qualname__ = f"{cls.__qualname__}.{name}"
            member.__module__ = cls.__module__
    return cls


def _shown_as(
    op: Callable[..., Any], method: Callable[..., R], iterator: Any = None
) -> Callable[..., R]:
    """`method` with `op`'s name, docstring and parameters after `self`, returning the value
    of `op`'s `Call` or `Plan` (of a `Listing`: an `iterator` of its items).

    `self` may be passed by name, as to a method written out; to mypy it is positional
    (`Concatenate`), which is why the binders' `Callable[..., R]` is not checked further.
    """
    functools.update_wrapper(method, op)
    shown: Any = method
    signature = inspect.signature(op)  # `op`'s annotations as written: strings
    value = _value_of(signature.return_annotation)
    hint = typing.get_args(typing.get_type_hints(op)["return"])[-1]
    if iterator is not None:
        value, hint = f"{iterator.__name__}[{value}]", iterator[hint]
    self_ = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    shown.__signature__ = signature.replace(
        parameters=[self_, *signature.parameters.values()], return_annotation=value
    )
    # Not `op`'s own dict (update_wrapper shares it); resolved in `op`'s module (__wrapped__).
    shown.__annotations__ = {**op.__annotations__, "return": hint}
    return method


def _value_of(annotation: str) -> str:
    """`Call[Env]` → `Env`: what an operation's `Call`, `Listing` or `Plan` makes."""
    found = re.fullmatch(r"(?:ops\.)?(?:Call|Listing|Plan)\[(.*)\]", annotation)
    if found is None:
        raise TypeError(f"an operation returns a Call, a Listing or a Plan, not {annotation}")
    return found[1]
