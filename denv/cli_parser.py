"""The parser of every `denv` command: its errors never echo a value that may be a secret.

argparse reports unknown options with everything after them: `denv serve --api-key KEY`
printed "unrecognized arguments: --api-key KEY", the key on the terminal and in any log
that captures it. `CommandParser` names the unknown options and only counts the values
that came with them; an unknown option that looks like it takes a key (`--api-key`,
`--token`, `--password` ...) also gets how to pass a key instead. Its other errors ("invalid
int value: '...'") show `***` for the value of any option named like a key, and for
anything shaped like a denv key (`dak_...`), wherever it was given.

    parser = CommandParser(prog="denv serve", allow_abbrev=False)
    parser.parse_args(["--api-key", "dak_..."])
    # denv serve: error: unrecognized arguments: --api-key and 1 value (not shown: it may
    # be a secret). A key never goes on the command line, where ps shows it to every user:
    # ...
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["KEY_ADVICE", "CommandParser", "is_secret_option", "unrecognized_message"]

# Option names that take a secret (or, for --api-key-file and --tls-key, its file); not a
# cap per key (--max-envs-per-key).
_SECRET_NAME = re.compile(
    r"(?<![a-z])(?<!per-)(?:api-?keys?|keys?|tokens?|passw\w*|secrets?|credentials?)(?![a-z])",
    re.IGNORECASE,
)
# A denv API key, wherever it was put by mistake.
_KEY_SHAPED = re.compile(r"dak_[A-Za-z0-9_-]+")
HIDDEN = "***"

KEY_ADVICE = (
    "A key never goes on the command line, where ps shows it to every user: clients read "
    "$DENV_API_KEY (else the local server's state directory), and `denv serve` reads "
    "--api-key-file PATH (a file of mode 0600), else $DENV_API_KEY."
)


def is_secret_option(arg: str) -> bool:
    """Whether ``arg`` (``--name`` or ``--name=value``) is an option named like a secret."""
    return arg.startswith("-") and bool(_SECRET_NAME.search(arg.split("=", 1)[0]))


def unrecognized_message(extras: Sequence[str]) -> str:
    """What to say about arguments nobody recognised, naming options but no value."""
    options = list(dict.fromkeys(a.split("=", 1)[0] for a in extras if a.startswith("-")))
    values = sum(1 for a in extras if not a.startswith("-") or "=" in a)
    parts = [", ".join(options)] if options else []
    if values:
        parts.append(f"{values} value{'s' if values > 1 else ''}")
    noun = "argument" if len(extras) == 1 else "arguments"
    text = f"unrecognized {noun}: {' and '.join(parts)}"
    if values:
        text += " (not shown: it may be a secret)" if values == 1 else " (not shown)"
    if any(is_secret_option(a) for a in extras):
        text += f". {KEY_ADVICE}"
    return text


def _secrets(args: Sequence[str]) -> list[str]:
    """The values in ``args`` never to echo: those of options named like a secret, and
    anything shaped like a denv key."""
    found: list[str] = []
    for i, arg in enumerate(args):
        if is_secret_option(arg):
            _, eq, value = arg.partition("=")
            if eq:
                found.append(value)
            elif i + 1 < len(args):
                found.append(args[i + 1])
        found += _KEY_SHAPED.findall(arg)
    return sorted({s for s in found if s}, key=len, reverse=True)


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose error messages echo no secret (see the module's doc).

    Subparsers made with ``add_subparsers().add_parser`` are of this class too."""

    _seen: Sequence[str] = ()

    def _remember(self, args: Sequence[str]) -> None:
        # Subparsers see the whole command line too: not every Python hands them their
        # part through parse_known_args.
        self._seen = args
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    if isinstance(sub, CommandParser):
                        sub._remember(args)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        seen = list(sys.argv[1:] if args is None else args)
        self._remember(seen)
        return super().parse_known_args(seen, namespace)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            super().error(unrecognized_message(extras))  # holds no value to hide
        return parsed

    def error(self, message: str) -> NoReturn:
        for secret in _secrets(self._seen):
            message = message.replace(f"'{secret}'", f"'{HIDDEN}'")  # argparse quotes values
            if len(secret) >= 8:
                message = message.replace(secret, HIDDEN)
        super().error(message)
