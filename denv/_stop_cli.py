"""`denv stop`: stop what denv runs for you.

The local server that `denv serve` or the provider started is stopped (its envs keep running
until deleted, and the next start picks them up). A remote server (`--server`, or a
DENV_SERVER that is not the local server) is not this machine's to stop: there `denv stop`
deletes the envs of this key, which is what stopping can mean for them.
"""

from __future__ import annotations

import argparse
import os

from ._cli_common import Output, describe
from ._cli_envs import delete_envs, envs_word
from .client._client import Denv
from .client._config import ENV_SERVER
from .client.errors import DenvError
from .client.local import read_local_server, stop_local_server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        default=None,
        help="the local server's state directory (default $DENV_STATE_DIR or "
        "~/.local/share/denv); given, the local server is stopped whatever DENV_SERVER says",
    )
    parser.add_argument(
        "--server",
        default=None,
        help="a remote denv server's URL (default $DENV_SERVER): delete this key's envs on it "
        "(the key comes from $DENV_API_KEY)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def remote_server(args: argparse.Namespace) -> str | None:
    """The server whose envs to delete, or None to stop the local server."""
    if args.server is None and args.state_dir is not None:
        return None
    target = (args.server or os.environ.get(ENV_SERVER) or "").rstrip("/")
    if not target:
        return None
    local = read_local_server(args.state_dir)
    return None if local is not None and local.url == target else target


def main(args: argparse.Namespace) -> int:
    remote = remote_server(args)
    if remote is not None:
        return _delete_remote_envs(remote, Output(args.json))
    stopped = stop_local_server(args.state_dir)
    if stopped is None:
        print("denv stop: no local denv server is running for that state directory")
        return 0
    print(f"denv stop: stopped the local server at {stopped.url} (pid {stopped.pid})")
    return 0


def _delete_remote_envs(server: str, out: Output) -> int:
    try:
        with Denv(server) as denv:
            env_ids = [env.id for env in denv.list_envs()]
            failed = delete_envs(denv, env_ids, out, "stop")
    except DenvError as exc:
        out.error(f"denv stop: {describe(exc)}")
        return 1
    if not out.as_json:
        deleted = len(env_ids) - len(failed)
        out.print(
            f"denv stop: deleted {deleted} {envs_word(deleted)} of this key on the denv server "
            f"at {server}; the server keeps running (it is not this machine's local server)"
        )
    return 1 if failed else 0
