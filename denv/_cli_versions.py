"""`denv versions`, `denv snapshot ENV`, `denv diff A B` and `denv gc`."""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.table import Table

from ._cli_common import Command, Output, add_label_option, age, id_problem, labels_text
from .client._client import Denv
from .client.types import FileChangeKind

CHANGE_STYLE = {
    FileChangeKind.ADDED: "green",
    FileChangeKind.MODIFIED: "yellow",
    FileChangeKind.DELETED: "red",
}

# -- denv versions


def _add_versions(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project", help="only versions of this project")


def _versions(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    versions = list(denv.list_versions(args.project))
    if out.as_json:
        out.json([v.to_dict() for v in versions])
        return 0
    if not versions:
        out.print("no versions")
        return 0
    table = Table(box=None, header_style="bold")
    columns = ("VERSION", "PROJECT", "PARENT ENV", "PARENT VERSION", "IMAGES", "LAYERS", "SIZE")
    for name in (*columns, "AGE"):
        table.add_column(
            name,
            no_wrap=name in {"VERSION", "PARENT ENV", "PARENT VERSION", "SIZE"},
            justify="right" if name == "SIZE" else "left",
        )
    table.add_column("LABELS")
    for v in versions:
        table.add_row(
            v.id,
            escape(v.project or "-"),
            v.parent_env_id or "-",
            v.parent_version_id or "-",
            escape(" ".join(s.image for s in v.services)),
            str(v.layer_depth),
            size_text(v.size_bytes) + ("" if not v.implicit else " *"),
            age(v.created_at),
            escape(labels_text(v.labels)),
        )
    out.print(table)
    if any(v.implicit for v in versions):
        out.print(
            "* made by a sandbox or a fork: deleted once no env and no child version needs "
            "it (keep one with `denv snapshot`)"
        )
    return 0


def size_text(n: int) -> str:
    """Bytes as a person reads them: 812 B, 4.0 KiB, 1.2 GiB."""
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


VERSIONS = Command(_add_versions, _versions)


# -- denv snapshot ENV


def _add_snapshot(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env", metavar="ENV", help="the env to snapshot (env_...)")
    add_label_option(parser, "a label on the version (repeatable)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the version's id")


def _snapshot(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    problem = id_problem("ENV", args.env, "env")
    if problem:
        out.error(f"denv snapshot: {problem}")
        return 2
    version = denv.snapshot(args.env, labels=dict(args.label) or None)
    if out.as_json:
        out.json(version.to_dict())
    elif args.quiet:
        print(version.id)
    else:
        out.print(f"{version.id} (a snapshot of {args.env})")
    return 0


SNAPSHOT = Command(_add_snapshot, _snapshot)


# -- denv diff A B


def _add_diff(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", metavar="A", help="the version to compare from (ver_...)")
    parser.add_argument("version", metavar="B", help="the version to compare to (ver_...)")


def _diff(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    for argument, given in (("A", args.base), ("B", args.version)):
        if given.startswith("env_"):
            out.error(
                f"denv diff: {given} is an env; diff compares versions: snapshot the env "
                f"first (`denv snapshot {given}`; its versions: `denv tree {given}`)"
            )
            return 2
        problem = id_problem(argument, given, "version")
        if problem:
            out.error(f"denv diff: {problem}")
            return 2
    diff = denv.diff(args.base, args.version)
    if out.as_json:
        out.json(diff.to_dict())
        return 0
    counts = {kind: sum(c.change is kind for c in diff.changes) for kind in FileChangeKind}
    summary = ", ".join(f"{n} {kind.value}" for kind, n in counts.items())
    more = " (more differ: the list is truncated)" if diff.truncated else ""
    out.print(f"{diff.base_version_id} -> {diff.version_id}: {summary}{more}")
    if diff.changes:
        table = Table(box=None, header_style="bold")
        for name in ("CHANGE", "PATH", "SIZE", "SERVICE"):
            table.add_column(name, justify="right" if name == "SIZE" else "left")
        for c in diff.changes:
            style = CHANGE_STYLE[c.change]
            table.add_row(f"[{style}]{c.change.value}[/]", escape(c.path), str(c.size), c.service)
        out.print(table)
    return 0


DIFF = Command(_add_diff, _diff)


# -- denv gc


def _add_gc(parser: argparse.ArgumentParser) -> None:
    pass


def _gc(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    freed = denv.gc()
    if out.as_json:
        out.json(freed.to_dict())
    else:
        out.print(
            f"deleted {freed.versions_deleted} expired version(s) and "
            f"{freed.layers_deleted} layer(s): {size_text(freed.bytes_freed)} freed"
        )
    return 0


GC = Command(_add_gc, _gc)
