"""`denv export`: a denv version as an OpenEnv environment package, or as a Harbor task.

    denv export --openenv echo@latest ./echo-env     # openenv.yaml, server/, README
    denv export --harbor echo@ver_01J... ./echo-task # task.toml, environment/, tests/

The exported server's every `reset` starts a new env from the version through denv (the
trainer's DENV_SERVER / DENV_API_KEY) and deletes the one before, so each episode begins
from the version's exact state. From Python: `export_version(client, ref, dest, kind=...)`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from denv.errors import DenvConfigError, DenvError

from ._files import harbor_files, openenv_files
from ._plan import ExportError, ExportPlan, declared_tools, make_plan, resolve_version
from ._write import Progress, check_destination, write_tree

if TYPE_CHECKING:
    from denv import Denv

__all__ = ["ExportError", "ExportPlan", "add_arguments", "export_version", "main"]

log = logging.getLogger(__name__)

Kind = Literal["openenv", "harbor"]


def export_version(
    client: Denv,
    ref: str,
    dest: Path,
    *,
    kind: Kind = "openenv",
    force: bool = False,
    compose: str | None = None,
    tools: Sequence[str] = (),
    progress: Progress | None = None,
) -> ExportPlan:
    """Write the version `ref` names as `kind` into `dest`; nothing is written on error.

    `client` is a `denv.Denv`. The MCP tools to expose are the ones the version declares
    (`Version.tools`, its compose file's `x-denv.tools`); `compose` (the compose file the
    project was deployed from) supplies them for a version from a server that did not keep
    them, and `tools` adds names.
    """
    progress = progress or Progress(quiet=True)
    check_destination(dest, force)  # before any request: a bad DIR fails fast
    progress.step(f"resolving {ref} on {client.server}")
    version = resolve_version(client, ref).to_dict()
    declared = declared_tools(version, compose, tools)
    plan = make_plan(version, declared, progress=progress)
    files = openenv_files(plan, ref) if kind == "openenv" else harbor_files(plan, ref)
    write_tree(dest, files, force=force, progress=progress)
    return plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--openenv",
        metavar="PROJECT@VERSION",
        help="write an OpenEnv environment package (VERSION: ver_..., or latest; "
        "a bare ver_... works too)",
    )
    what.add_argument("--harbor", metavar="PROJECT@VERSION", help="write a Harbor task directory")
    parser.add_argument("dir", metavar="DIR", type=Path, help="the folder to create")
    parser.add_argument(
        "--force", action="store_true", help="replace DIR when it exists and is not empty"
    )
    parser.add_argument(
        "--compose",
        metavar="FILE",
        type=Path,
        help="the compose file the project was deployed from: its x-denv.tools are the MCP "
        "tools to expose (only for a version whose server did not keep them: Version.tools)",
    )
    parser.add_argument(
        "--tool",
        action="append",
        default=[],
        metavar="NAME",
        help="an MCP tool to expose (repeatable); without tools declared, all the env lists",
    )
    parser.add_argument("--server", help="the denv server (default: DENV_SERVER, else local)")
    parser.add_argument(
        "--api-key-file",
        metavar="PATH",
        type=Path,
        help="a file holding its API key (default: DENV_API_KEY, else the local server's); "
        "never the key itself on the command line, where ps shows it",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def main(args: argparse.Namespace) -> int:
    from denv import Denv

    kind: Kind = "openenv" if args.openenv else "harbor"
    ref: str = args.openenv or args.harbor
    dest: Path = args.dir
    progress = Progress(quiet=args.quiet)
    try:
        compose = args.compose.read_text() if args.compose else None
    except OSError as exc:
        print(f"denv export: cannot read --compose {args.compose}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        api_key = args.api_key_file.read_text().strip() if args.api_key_file else None
    except OSError as exc:
        print(
            f"denv export: cannot read --api-key-file {args.api_key_file}: {exc.strerror}",
            file=sys.stderr,
        )
        return 2
    try:
        with Denv(args.server, api_key) as client:
            print(f"denv export: {ref} as {kind} into {dest}", file=sys.stderr)
            plan = export_version(
                client,
                ref,
                dest,
                kind=kind,
                force=args.force,
                compose=compose,
                tools=args.tool,
                progress=progress,
            )
    except (ExportError, DenvConfigError, DenvError) as exc:
        print(f"denv export: {exc}", file=sys.stderr)
        return 1
    print(
        f"denv export: wrote {plan.version_id} ({plan.agent_service}: {plan.agent.image}, "
        f"pinned by {plan.agent.kind}) to {dest}; see {dest / 'README.md'}"
        if kind == "openenv"
        else f"denv export: wrote the Harbor task {plan.version_id} to {dest}",
        file=sys.stderr,
    )
    return 0
