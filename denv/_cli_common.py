"""What the commands for people (`denv envs`, `versions`, `tree` ...) share.

A `Command` is one subcommand: its arguments and its body. The body gets a `Denv` client
and an `Output`; any `DenvError` it raises becomes one line on stderr, naming the problem
and the fix, and exit status 1. `--json` makes every command print plain JSON for scripts
instead of rich tables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from .client._client import Denv
from .client.errors import DenvError, NotFound
from .client.types import EnvStatus

#: Width used when stdout is no terminal (a pipe, a file, a test): ids never wrap.
PIPE_WIDTH = 200

STATUS_STYLE = {
    EnvStatus.CREATING: "yellow",
    EnvStatus.STARTING: "yellow",
    EnvStatus.RUNNING: "green",
    EnvStatus.HEALTHY: "green",
    EnvStatus.FAILED: "red",
    EnvStatus.DELETED: "dim",
}


class Output:
    """Where a command writes: rich markup on a terminal, JSON with `--json`."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)

    def json(self, value: Any) -> None:
        print(json.dumps(value, indent=2, sort_keys=True))

    def print(self, *objects: Any) -> None:
        self.console.print(*objects, highlight=False)

    def error(self, text: str) -> None:
        print(text, file=sys.stderr)  # one unwrapped line, whatever the terminal's width


@dataclass(frozen=True)
class Command:
    """One subcommand: `add_arguments(parser)` and `run(denv, args, out) -> exit status`."""

    add: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Denv, argparse.Namespace, Output], int]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--server",
            default=None,
            help="the denv server's URL (default $DENV_SERVER, else the local server); "
            "the key comes from $DENV_API_KEY or the local server's state directory",
        )
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
        self.add(parser)

    def main(self, args: argparse.Namespace) -> int:
        out = Output(args.json)
        try:
            # The server is found on the first call, so bad arguments are reported first.
            # Detached: what `denv run` or `denv fork` makes outlives the command, until its
            # ttl or `denv rm` (a lease would delete it as the command exits).
            with Denv(args.server, detach=True) as denv:
                return self.run(denv, args, out)
        except DenvError as exc:
            out.error(f"denv {args.command}: {describe(exc)}")
            return 1


def describe(exc: DenvError) -> str:
    """The error's message, with what to do about an unknown id."""
    text = str(exc)
    if isinstance(exc, NotFound):
        return f"{text} (list what exists with `denv envs --all` or `denv versions`)"
    return text


# The contract's id patterns (openapi/denv.yaml EnvId, VersionId): checked here so a typo is
# named by its argument before anything is sent.
_ID_PATTERNS = {
    "env": re.compile(r"^env_[0-9A-HJKMNP-TV-Z]{26}$"),
    "version": re.compile(r"^ver_[0-9A-HJKMNP-TV-Z]{26}$"),
}
_ID_LISTS = {"env": "`denv envs`", "version": "`denv versions`"}


def id_problem(argument: str, value: str, kind: str) -> str | None:
    """What is wrong with `value` as an id of `kind` ("env", "version"), naming the command's
    `argument`; None when it is one."""
    if _ID_PATTERNS[kind].match(value):
        return None
    article = "an" if kind == "env" else "a"
    prefix = "env_" if kind == "env" else "ver_"
    return (
        f"{argument} {value!r} is not {article} {kind} id ({prefix} and 26 letters and digits, "
        f"as {_ID_LISTS[kind]} lists them)"
    )


def label_arg(text: str) -> tuple[str, str]:
    """`--label KEY=VALUE` (argparse `type`): the pair, or an error naming the form."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. --label run=a1)")
    return key, value


def add_label_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """A repeatable `--label KEY=VALUE`, collected as a list of pairs in `args.label`."""
    parser.add_argument(
        "--label",
        dest="label",
        metavar="KEY=VALUE",
        type=label_arg,
        action="append",
        default=[],
        help=help_text,
    )


def age(when: datetime.datetime, now: datetime.datetime | None = None) -> str:
    """How long ago, in the largest whole unit: 42s, 5m, 3h, 2d."""
    now = now or datetime.datetime.now(datetime.UTC)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def status_text(status: EnvStatus) -> str:
    """The status in its colour (rich markup)."""
    return f"[{STATUS_STYLE.get(status, '')}]{status.value}[/]"


def labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
