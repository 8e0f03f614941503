"""`Denv` and `AsyncDenv` are bound from one definition of each operation (issue 44), and
users see the same API as when every method was written out in both facades.

Each public method's signature and docstring live on its operation
(`denv.client._operations`, `denv.client._lineage`); the facades bind them
(`denv.client._binding`). Checked here: what `inspect` and `help()` show (the real
parameters, after `self`, the same in both facades, each with its docstring), and what mypy
--strict sees from user code (a correct snippet passes, wrong calls are reported).
"""

from __future__ import annotations

import inspect
import pydoc
import subprocess
import sys
import textwrap
import typing
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from denv import AsyncDenv, Denv, Env

ROOT = Path(__file__).resolve().parents[2]


def _facade_methods(cls: type) -> set[str]:
    return {
        name for name, member in vars(cls).items() if callable(member) and not name.startswith("_")
    }


METHODS = sorted(_facade_methods(Denv))


def test_both_facades_have_the_same_methods() -> None:
    assert _facade_methods(AsyncDenv) == set(METHODS)
    assert {"create_sandbox", "fork", "envs_from_version", "lineage", "list_envs"} <= set(METHODS)


@pytest.mark.parametrize("name", METHODS)
def test_sync_and_async_show_the_same_real_parameters_and_docstring(name: str) -> None:
    sync, async_ = getattr(Denv, name), getattr(AsyncDenv, name)
    shown, shown_async = inspect.signature(sync), inspect.signature(async_)
    assert shown.parameters == shown_async.parameters
    params = list(shown.parameters.values())
    assert params[0].name == "self" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    # The operation's own parameters, not a forwarding (*args, **kwargs).
    kinds = {p.kind for p in params}
    assert not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}
    assert params[1:] == list(inspect.signature(inspect.unwrap(sync)).parameters.values())
    # What the call gives back, as a method written out declares it.
    if name.startswith("list_"):
        assert shown_async.return_annotation == f"Async{shown.return_annotation}"
        assert shown.return_annotation.startswith("Iterator[")
        assert not inspect.iscoroutinefunction(async_)
    else:
        assert shown_async.return_annotation == shown.return_annotation
        assert not shown.return_annotation.startswith(("Call[", "Plan[", "Listing["))
        assert inspect.iscoroutinefunction(async_)
    assert not inspect.iscoroutinefunction(sync)
    # One docstring, shown by help() for both, under the facade's name.
    doc = inspect.getdoc(sync)
    assert doc and doc == inspect.getdoc(async_)
    for method, cls in ((sync, Denv), (async_, AsyncDenv)):
        assert method.__qualname__ == f"{cls.__name__}.{name}"
        assert method.__module__ == cls.__module__
        text = pydoc.render_doc(method, renderer=pydoc.plaintext)
        assert f"{name}(self" in text and doc.splitlines()[0] in text
        typing.get_type_hints(method)  # every annotation resolves


def test_create_sandbox_lists_its_keyword_arguments_with_their_defaults() -> None:
    params = inspect.signature(Denv.create_sandbox).parameters
    assert list(params) == [
        "self", "image", "ports", "env", "egress", "command", "volumes", "labels", "ttl_s",
        "wait", "wait_timeout_s", "health_path", "pull", "warm", "warm_fork",
        "idempotency_key", "live",
    ]  # fmt: skip
    assert {name: p.default for name, p in params.items() if name not in {"self", "image"}} == {
        "ports": None, "env": None, "egress": "deny", "command": None, "volumes": None,
        "labels": None, "ttl_s": None, "wait": "healthy", "wait_timeout_s": None,
        "health_path": None, "pull": False, "warm": 0, "warm_fork": False,
        "idempotency_key": None, "live": False,
    }  # fmt: skip
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(params.values())[2:])
    listed = typing.get_type_hints(Denv.list_envs)["return"]
    listed_async = typing.get_type_hints(AsyncDenv.list_envs)["return"]
    assert typing.get_origin(listed) is Iterator
    assert typing.get_origin(listed_async) is AsyncIterator
    assert typing.get_args(listed) == typing.get_args(listed_async) == (Env,)
    assert typing.get_type_hints(AsyncDenv.create_sandbox)["return"] is Env


# -- what mypy --strict sees from user code

GOOD = """
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, assert_type

from denv import AsyncDenv, Denv
from denv.types import Env, Fork, Version, WarmPool


def blocking(denv: Denv) -> None:
    env = denv.create_sandbox("img", ports=[8000], egress="allow", wait="running", live="auto")
    assert_type(env, Env)
    assert_type(denv.create_sandboxes("img", 4, labels={"a": "b"}), list[Env])
    assert_type(denv.fork(env.id, 2, kind="live", reseed=False), Fork)
    assert_type(denv.envs_from_version("ver_1", wait_timeout_s=5.0), list[Env])
    assert_type(denv.list_envs(status="healthy"), Iterator[Env])
    assert_type(denv.lineage(env.id), list[Env | Version])
    assert_type(denv.logs(env.id, tail=5), list[str])
    assert_type(denv.delete_env(env.id), None)
    assert_type(denv.warm_pool(env.id), WarmPool)


async def awaited(denv: AsyncDenv) -> None:
    assert_type(denv.create_sandbox("img"), Coroutine[Any, Any, Env]).close()  # not sent
    env = await denv.create_sandbox("img", ports=[8000], live=True)
    assert_type(env, Env)
    assert_type(await denv.fork(env.id, count=3), Fork)
    assert_type(await denv.wait_env(env.id, "healthy", 10.0), Env)
    assert_type(denv.list_versions(), AsyncIterator[Version])
    async for child in denv.list_envs(version_id="ver_1"):
        assert_type(child, Env)
    assert_type(await denv.lineage(env.id), list[Env | Version])
"""

# Each line is one wrong call; mypy must report every one of them (and nothing else).
BAD = """
from denv import AsyncDenv, Denv
from denv.types import Env


async def wrong(denv: Denv, adenv: AsyncDenv) -> None:
    denv.create_sandbox("img", portz=[8000])
    denv.create_sandbox("img", ttl_s="1h")
    denv.create_sandbox("img", [8000])
    denv.fork("env_1", kind="sideways")
    denv.snapshot("env_1", {"a": "b"})
    env: Env = adenv.get_env("env_1")
    await adenv.envs_from_version("ver_1", live="sometimes")
    await adenv.lineage(42)
"""


def test_user_code_type_checks_and_wrong_calls_are_reported(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(textwrap.dedent(GOOD))
    bad.write_text(textwrap.dedent(BAD))
    run = subprocess.run(
        [
            sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
            "--config-file", str(ROOT / "pyproject.toml"),
            "--cache-dir", str(tmp_path / "mypy-cache"),
            str(good), str(bad),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert not [e for e in errors if e.startswith(str(good))], run.stdout
    wrong_lines = {
        number
        for number, line in enumerate(bad.read_text().splitlines(), 1)
        if line.startswith(("    denv.", "    env:", "    await"))
    }
    reported = {int(e.split(":")[1]) for e in errors if e.startswith(str(bad))}
    assert reported == wrong_lines, run.stdout
    assert run.returncode == 1, run.stdout + run.stderr
