"""The `denv` command line.

Each subcommand lives in the module that owns its concept and is imported
only when used, so `denv --help` works with just the base install.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from denv.cli_parser import CommandParser
from denv.redaction import RedactSecrets

# subcommand -> (module, one-line help). The module (or, for "module:NAME", the object NAME in
# it) provides `add_arguments(parser)` and `main(args) -> int`.
_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("denv._cli_run:RUN", "create an env from an image; print its id and address"),
    "envs": ("denv._cli_envs:ENVS", "list envs (those not deleted; --all adds deleted ones)"),
    "versions": ("denv._cli_versions:VERSIONS", "list versions (snapshots and deploys)"),
    "logs": ("denv._cli_envs:LOGS", "print an env's last log lines"),
    "rm": ("denv._cli_envs:RM", "delete envs: by id, every one (--all), or by --label"),
    "snapshot": ("denv._cli_versions:SNAPSHOT", "save an env's volumes as a new version"),
    "fork": ("denv._cli_envs:FORK", "snapshot an env once and start N children from it"),
    "tree": ("denv._cli_tree:TREE", "the branch tree of an env or a version"),
    "open": (
        "denv._cli_open:OPEN",
        "print (or --browser: open) an env's web page URL (/web/), or the console's",
    ),
    "diff": ("denv._cli_versions:DIFF", "the files that changed between two versions"),
    "gc": (
        "denv._cli_versions:GC",
        "delete expired versions (made by sandboxes and forks, no longer needed) now",
    ),
    "serve": ("denv.server.serve_cli", "run the local denv server on this machine's Docker Engine"),
    "stop": (
        "denv._stop_cli",
        "stop the local server (its envs keep running until deleted); with a remote "
        "server (--server or DENV_SERVER), delete this key's envs on it",
    ),
    "gvisor": (
        "denv.server.gvisor.cli",
        "install gVisor's runtime on this machine's Docker Engine (install) or check it",
    ),
    "cluster": (
        "denv.cluster.cluster_cli",
        "a Ray cluster of N nodes on this machine: up, status, down (see docs/cluster.md)",
    ),
    "conformance": (
        "denv.openenv.conformance",
        "check that OpenEnv environments start, step, fork and close correctly on denv",
    ),
    "export": (
        "denv.openenv.export",
        "write a version as an OpenEnv environment package or a Harbor task",
    ),
}

_EXTRA_FOR_MODULE = {
    "denv.server": "server",
    "denv.openenv": "openenv",
    "denv.cluster": "cluster",
}


def _load(target: str) -> object:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr) if attr else module
    except ImportError as exc:
        extra = next((e for m, e in _EXTRA_FOR_MODULE.items() if module_name.startswith(m)), None)
        hint = f": install it with pip install 'denv[{extra}]'" if extra else ""
        raise SystemExit(f"denv: this command needs {exc.name or module_name}{hint}") from exc


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("denv")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    # Its errors name unknown options but echo no value that may be a key (cli_parser).
    parser = CommandParser(
        prog="denv",
        description="Run reinforcement-learning environments as sandboxes and fork their state.",
    )
    parser.add_argument("--version", action="version", version=f"denv {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in _SUBCOMMANDS.items():
        # No abbreviations: `--api-key dak_...` must not pass for `--api-key-file`.
        sub_parser = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        sub_parser.set_defaults(_module=module_name)
        # Arguments are added only for the chosen subcommand (see main), so a
        # missing extra never breaks `denv --help`.
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # The chosen subcommand's module adds its arguments before the real parse,
    # so `denv serve --help` lists them.
    command = next((a for a in argv if a in _SUBCOMMANDS), None)
    if command is None:
        args = parser.parse_args(argv)
        parser.print_help()
        return 2
    target = _SUBCOMMANDS[command][0]
    if command == "serve" and any(a == "--cluster" or a.startswith("--cluster=") for a in argv):
        target = "denv.cluster.serve"  # the same server, its envs on a Ray cluster's nodes
    module = _load(target)
    module.add_arguments(_subparser(parser, command))  # type: ignore[attr-defined]
    args = parser.parse_args(argv)
    stderr = logging.StreamHandler()
    stderr.addFilter(RedactSecrets())  # -v logs URLs: ingress ones hold their token
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[stderr],
    )
    if not args.verbose:  # one line per HTTP request drowns what the command says
        for noisy in ("httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    result: int = module.main(args)  # type: ignore[attr-defined]
    return result


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen: argparse.ArgumentParser = action.choices[name]
            return chosen
    raise KeyError(name)


if __name__ == "__main__":
    raise SystemExit(main())
