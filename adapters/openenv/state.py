"""Forkable state: an OpenEnv environment whose episode survives a restart, and so a fork.

A denv fork carries what is in the env's volumes, never process memory: the child's
server is a fresh process (cold fork) or one that booted before the fork and has never
seen this episode (warm fork). OpenEnv servers create an ``Environment`` instance for
every session (each WebSocket client, each ``GET /state``), so an environment that saves
its ``State`` under ``/work`` after every ``reset`` and ``step``, and loads it whenever an
instance is created, shows a forked child's client exactly the parent's state.

Opt in with the mixin, first among the bases::

    from denv.openenv.state import ForkableState

    class EchoEnvironment(ForkableState, MCPEnvironment):
        __denv_fields__ = ("last_message",)   # optional: attributes to carry besides State

        def __init__(self) -> None:
            ...
            self._state = State(episode_id=str(uuid4()))   # restored after __init__ returns

or with the decorator, which does the same to one class (subclasses of it must opt in
again)::

    @forkable(fields=("last_message",))
    class EchoEnvironment(MCPEnvironment): ...

What is saved: ``env.state`` as JSON (``model_dump(mode="json")``), plus every attribute
named in ``__denv_fields__`` (JSON values, or pydantic models restored to the type of the
attribute's value after ``__init__``). The state is restored into the attribute named by
``__denv_state_attr__`` (default ``"_state"``, the convention of OpenEnv's own envs).

Where: ``$DENV_STATE_PATH`` if set, else ``/work/.denv/state.json`` when ``/work`` exists
(every denv env has it), else nowhere: outside denv the env runs as if it had not opted in.
Writes are atomic (temporary file, fsync, ``os.replace``), so a snapshot taken at any
instant holds either the previous state or the new one, never half a file.

One file per ``/work``: an env that serves several sessions at once shares one saved
episode between them (the last writer wins), which is what a fork needs and what
``SUPPORTS_CONCURRENT_SESSIONS`` envs should expect. Persisting happens when the outermost
hooked call returns (``reset``, ``step``, and ``reset_async``/``step_async`` where the env
or its base overrides them), so the state saved is the one a client saw. State changed
elsewhere (an MCP tool called over ``/mcp``) is saved with the next step, or at once with
``save_state(env)``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar, TypeVar, overload

__all__ = [
    "DEFAULT_STATE_PATH",
    "STATE_PATH_ENV",
    "ForkableState",
    "StateFileError",
    "forkable",
    "restore_state",
    "save_state",
    "state_path",
]

logger = logging.getLogger(__name__)

STATE_PATH_ENV = "DENV_STATE_PATH"
DEFAULT_STATE_PATH = Path("/work/.denv/state.json")
_FORMAT = 1

_T = TypeVar("_T", bound=type)
# Set on every wrapper this module makes, so no method is wrapped twice.
_MARK = "__denv_forkable_hook__"
# Per-instance nesting depth of hooked calls: only the outermost one saves or restores
# (an __init__ that calls reset(), a step() that calls super().step()).
_DEPTH = "_denv_hook_depth"


class StateFileError(RuntimeError):
    """The saved state file exists but cannot be read back into this environment."""


def state_path() -> Path | None:
    """Where the state is saved: ``$DENV_STATE_PATH``, else ``/work/.denv/state.json``
    when ``/work`` exists, else ``None`` (not saved)."""
    configured = os.environ.get(STATE_PATH_ENV)
    if configured:
        return Path(configured)
    if DEFAULT_STATE_PATH.parent.parent.is_dir():
        return DEFAULT_STATE_PATH
    return None


def _fields(env: object) -> tuple[str, ...]:
    fields = getattr(type(env), "__denv_fields__", ())
    if isinstance(fields, str):  # ("x") instead of ("x",)
        return (fields,)
    return tuple(fields)


def _state_attr(env: object) -> str:
    return str(getattr(type(env), "__denv_state_attr__", "_state"))


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


def save_state(env: object) -> Path | None:
    """Save ``env.state`` and its declared fields now; return the file written, if any.

    The hooks call this after ``reset`` and ``step``; call it yourself after changing
    state anywhere else.
    """
    path = state_path()
    if path is None:
        return None
    record = {
        "format": _FORMAT,
        "env": f"{type(env).__module__}.{type(env).__qualname__}",
        "state": _dump(env.state),  # type: ignore[attr-defined]
        "fields": {name: _dump(getattr(env, name, None)) for name in _fields(env)},
    }
    try:
        payload = json.dumps(record, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"cannot save the state of {type(env).__name__}: {exc}; every field in "
            "__denv_fields__ must hold a JSON value or a pydantic model"
        ) from exc
    _write_atomic(path, payload.encode())
    logger.debug("saved %s state to %s", type(env).__name__, path)
    return path


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # The rename itself is durable only once the directory is synced.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(raw)
    except ValueError as exc:
        raise StateFileError(
            f"saved environment state {path} is not valid JSON ({exc}): "
            "delete it to start from a fresh episode"
        ) from exc
    if not isinstance(record, dict) or record.get("format") != _FORMAT:
        raise StateFileError(
            f"saved environment state {path} is not in format {_FORMAT} "
            "(written by another denv version?): delete it to start from a fresh episode"
        )
    return record


def _state_type(env: object, current: Any) -> Any:
    declared = getattr(type(env), "__denv_state_cls__", None)
    if declared is not None:
        return declared
    if current is not None:
        return type(current)
    from openenv.core.env_server.types import State

    return State


def restore_state(env: object) -> bool:
    """Load the saved state into ``env``; return whether there was one.

    The hooks call this when an instance has been created.
    """
    path = state_path()
    if path is None:
        return False
    record = _read(path)
    if record is None:
        return False
    attr = _state_attr(env)
    if not hasattr(env, attr):
        raise TypeError(
            f"{type(env).__name__} has no attribute {attr!r} to restore its state into: "
            f"set __denv_state_attr__ to the attribute that backs its `state` property"
        )
    current = getattr(env, attr)
    try:
        setattr(env, attr, _state_type(env, current).model_validate(record["state"]))
        saved_fields = record.get("fields") or {}
        for name in _fields(env):
            if name not in saved_fields:
                continue
            value = saved_fields[name]
            previous_type: Any = type(getattr(env, name, None))
            if hasattr(previous_type, "model_validate"):
                value = previous_type.model_validate(value)
            setattr(env, name, value)
    except (ValueError, TypeError, KeyError) as exc:
        # pydantic's ValidationError is a ValueError.
        raise StateFileError(
            f"saved environment state {path} (written by {record.get('env')}) does not fit "
            f"{type(env).__name__}: {exc}; delete it to start from a fresh episode"
        ) from exc
    logger.debug("restored %s state from %s", type(env).__name__, path)
    return True


def _after_init(env: object, ok: bool) -> None:
    if ok:
        restore_state(env)


def _after_change(env: object, ok: bool) -> None:
    if ok:
        save_state(env)
        return
    # The call failed part-way: save what memory now holds so that a fork taken now
    # agrees with the parent, but never hide the original error behind a save error.
    try:
        save_state(env)
    except Exception:
        logger.exception("could not save %s state after a failed call", type(env).__name__)


def _enter(env: object) -> int:
    depth: int = getattr(env, _DEPTH, 0)
    object.__setattr__(env, _DEPTH, depth + 1)
    return depth


def _exit(env: object, depth: int) -> None:
    object.__setattr__(env, _DEPTH, depth)


def _hook(fn: Callable[..., Any], after: Callable[[object, bool], None]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(self: object, *args: Any, **kwargs: Any) -> Any:
            depth = _enter(self)
            ok = False
            try:
                result = await fn(self, *args, **kwargs)
                ok = True
                return result
            finally:
                _exit(self, depth)
                if depth == 0:
                    after(self, ok)

        wrapper: Callable[..., Any] = async_wrapper
    else:

        @functools.wraps(fn)
        def sync_wrapper(self: object, *args: Any, **kwargs: Any) -> Any:
            depth = _enter(self)
            ok = False
            try:
                result = fn(self, *args, **kwargs)
                ok = True
                return result
            finally:
                _exit(self, depth)
                if depth == 0:
                    after(self, ok)

        wrapper = sync_wrapper
    setattr(wrapper, _MARK, True)
    return wrapper


_AFTER: dict[str, Callable[[object, bool], None]] = {
    "__init__": _after_init,
    "reset": _after_change,
    "step": _after_change,
    "reset_async": _after_change,
    "step_async": _after_change,
}


@functools.cache
def _openenv_defaults() -> frozenset[object]:
    # OpenEnv's server calls reset_async/step_async only when an env overrides them, and
    # otherwise runs the sync methods in a worker thread: wrapping the base defaults would
    # move every sync step onto the event loop.
    try:
        from openenv.core.env_server.interfaces import Environment
    except ImportError:
        return frozenset()
    return frozenset({Environment.reset_async, Environment.step_async})


def _install_hooks(cls: type) -> None:
    for name, after in _AFTER.items():
        fn = cls.__dict__.get(name)
        if fn is None:
            fn = getattr(cls, name, None)
            # Only __init__ must always be hooked; the others only when someone implements them.
            if fn is None or (name != "__init__" and fn in _openenv_defaults()):
                continue
        if not callable(fn) or getattr(fn, _MARK, False):
            continue
        if getattr(fn, "__isabstractmethod__", False):
            continue
        setattr(cls, name, _hook(fn, after))


class ForkableState:
    """Mixin that saves an OpenEnv ``Environment``'s state under ``/work`` after every
    ``reset`` and ``step`` and restores it in every new instance. See the module docstring.

    Example::

        class CounterEnv(ForkableState, Environment):
            __denv_fields__ = ("history",)
    """

    __denv_fields__: ClassVar[tuple[str, ...]] = ()
    __denv_state_attr__: ClassVar[str] = "_state"
    __denv_state_cls__: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _install_hooks(cls)


@overload
def forkable(cls: _T, /) -> _T: ...
@overload
def forkable(*, fields: Iterable[str] = ..., state_attr: str = ...) -> Callable[[_T], _T]: ...
def forkable(
    cls: _T | None = None,
    /,
    *,
    fields: Iterable[str] = (),
    state_attr: str = "_state",
) -> _T | Callable[[_T], _T]:
    """Class decorator form of :class:`ForkableState`, for one class.

    Example::

        @forkable(fields=("last_message",))
        class EchoEnvironment(MCPEnvironment): ...
    """
    field_names = (fields,) if isinstance(fields, str) else tuple(fields)

    def apply(target: _T) -> _T:
        if field_names:
            target.__denv_fields__ = field_names  # type: ignore[attr-defined]
        target.__denv_state_attr__ = state_attr  # type: ignore[attr-defined]
        _install_hooks(target)
        return target

    return apply(cls) if cls is not None else apply
