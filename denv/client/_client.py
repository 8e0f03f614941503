"""`Denv`: the typed facade over the generated denv API client.

Each method is its operation in `denv.client._operations` (signature, docstring, call), bound
by `denv.client._binding` and run by `ClientBase._call`; `AsyncDenv` (denv/client/_async.py)
binds the same operations awaited.
"""

from __future__ import annotations

from . import _lineage
from . import _operations as ops
from ._base import ClientBase
from ._binding import facade, sync_call, sync_list, sync_plan

__all__ = ["Denv"]


@facade
class Denv(ClientBase):
    """A client of one denv server (the local `denv serve`, or a hosted one).

    >>> with Denv() as denv:  # DENV_SERVER/DENV_API_KEY, else the local server
    ...     env = denv.create_sandbox("denv-echo-env:latest")
    ...     fork = denv.fork(env.id, count=4)
    ...     print([child.endpoints[0].url for child in fork.envs])

    Every call has a timeout (`timeout_s`; waits get theirs on top), raises a `DenvError`
    subclass on failure, and is retried up to `max_retries` times only when a retry cannot
    repeat work the server already did. Creates carry an Idempotency-Key made per call.
    Constructing a client does no I/O: the server is found on its first call (or at once
    with `Denv.from_environment()`).

    The envs a client creates are held by its lease: one background thread renews it, and
    when the client closes, or its process exits or dies (renewals stop for the lease's
    timeout, 15 s by default), the server deletes them. `detach=True` makes a client whose
    envs stay until their `ttl_s` or a delete (the `denv` CLI's); `detach(env_id)` keeps
    one env; `lease_id=` holds envs under another client's lease, which this one neither
    renews nor closes; `lease_timeout_s` asks for another timeout (5-600 s).
    A server with TLS (`denv serve --tls-cert`) whose certificate the system does not trust
    is checked against `ca_bundle`, a PEM file (default $DENV_CA_BUNDLE).
    (`_transport` and `_sleep` replace the network and the retry pause in tests.)
    """

    # -- server

    health = sync_call(ops.health)

    # -- envs

    create_sandbox = sync_call(ops.create_sandbox)
    create_sandboxes = sync_call(ops.create_sandboxes)
    get_env = sync_call(ops.get_env)
    list_envs = sync_list(ops.list_envs)
    delete_env = sync_call(ops.delete_env)
    detach = sync_call(ops.detach)
    wait_env = sync_call(ops.wait_env)
    logs = sync_call(ops.logs)
    warm_pool = sync_call(ops.warm_pool)

    # -- versions and forks

    snapshot = sync_call(ops.snapshot)
    fork = sync_call(ops.fork)
    envs_from_version = sync_call(ops.envs_from_version)
    get_version = sync_call(ops.get_version)
    list_versions = sync_list(ops.list_versions)
    delete_version = sync_call(ops.delete_version)
    gc = sync_call(ops.gc)
    lineage = sync_plan(_lineage.lineage)
    diff = sync_call(ops.diff)

    # -- projects

    deploy = sync_call(ops.deploy)
    list_projects = sync_list(ops.list_projects)
