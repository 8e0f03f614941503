"""`AsyncDenv`: the facade for asyncio, the same operations as `Denv`, awaited.

Each method is its operation in `denv.client._operations` (the one definition `Denv` binds
too: signature, docstring, call), bound by `denv.client._binding` and awaited through
`AsyncClientBase._call`.
"""

from __future__ import annotations

from . import _lineage
from . import _operations as ops
from ._async_base import AsyncClientBase
from ._binding import async_call, async_list, async_plan, facade

__all__ = ["AsyncDenv"]


@facade
class AsyncDenv(AsyncClientBase):
    """`Denv` for asyncio: every call a coroutine (lists are async iterators), on one loop.

    >>> async with AsyncDenv() as denv:  # DENV_SERVER/DENV_API_KEY, else the local server
    ...     env = await denv.create_sandbox("denv-echo-env:latest")
    ...     fork = await denv.fork(env.id, count=4)
    ...     async for env in denv.list_envs(status="healthy"):
    ...         print(env.id)

    Timeouts, retries, Idempotency-Keys and errors are `Denv`'s. Constructing a client does
    no I/O; the server is found on the first call, on a worker thread (finding or starting
    the local server reads files and waits on a process), so the event loop never blocks.
    (`_transport` and `_sleep` replace the network and the async retry pause in tests.)
    """

    # -- server

    health = async_call(ops.health)

    # -- envs

    create_sandbox = async_call(ops.create_sandbox)
    create_sandboxes = async_call(ops.create_sandboxes)
    get_env = async_call(ops.get_env)
    list_envs = async_list(ops.list_envs)
    delete_env = async_call(ops.delete_env)
    detach = async_call(ops.detach)
    wait_env = async_call(ops.wait_env)
    logs = async_call(ops.logs)
    warm_pool = async_call(ops.warm_pool)

    # -- versions and forks

    snapshot = async_call(ops.snapshot)
    fork = async_call(ops.fork)
    envs_from_version = async_call(ops.envs_from_version)
    get_version = async_call(ops.get_version)
    list_versions = async_list(ops.list_versions)
    delete_version = async_call(ops.delete_version)
    gc = async_call(ops.gc)
    lineage = async_plan(_lineage.lineage)
    diff = async_call(ops.diff)

    # -- projects

    deploy = async_call(ops.deploy)
    list_projects = async_list(ops.list_projects)
