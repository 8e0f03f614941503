"""`denv stop`: stop the local server that `denv serve` or the provider started."""

from __future__ import annotations

import argparse

from .local import stop_local_server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        default=None,
        help="the server's state directory (default $DENV_STATE_DIR or ~/.local/share/denv)",
    )


def main(args: argparse.Namespace) -> int:
    stopped = stop_local_server(args.state_dir)
    if stopped is None:
        print("denv stop: no local denv server is running for that state directory")
        return 0
    print(f"denv stop: stopped the local server at {stopped.url} (pid {stopped.pid})")
    return 0
