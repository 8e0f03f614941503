"""`denv tree ENV_OR_VERSION`: the branch tree an env or a version belongs to.

The tree is rooted where `Denv.lineage` ends (a sandbox's implicit version, or a deployed
one) and grows down through every record the key has: a version's envs (`Env.version_id`)
and the versions snapshotted from an env (`Version.parent_env_id`). Deleted envs are shown
only where something grew from them, unless `--all`; the path to the id asked for is always
shown.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.markup import escape
from rich.tree import Tree

from ._cli_common import Command, Output, age, labels_text, status_text
from .client._client import Denv
from .client.types import Env, EnvStatus, Version


@dataclass
class Node:
    """An env or a version, with what grew from it."""

    item: Env | Version
    children: list[Node] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        kind = "env" if isinstance(self.item, Env) else "version"
        return {
            "kind": kind,
            **self.item.to_dict(),
            "children": [c.to_dict() for c in self.children],
        }

    def ids(self) -> list[str]:
        """Every id in the tree, depth first."""
        return [self.item.id, *(i for c in self.children for i in c.ids())]


def build_tree(
    chain: list[Env | Version],
    versions: Iterable[Version],
    envs: Iterable[Env],
    *,
    show_deleted: bool = False,
) -> Node:
    """The tree under the root of `chain` (a lineage, nearest first).

    Envs and versions that `chain` holds are taken from it when the lists lack them.
    """
    by_version: dict[str, list[Env]] = defaultdict(list)
    by_env: dict[str, list[Version]] = defaultdict(list)
    seen: set[str] = set()
    for item in [*envs, *versions, *chain]:
        if item.id in seen:
            continue
        seen.add(item.id)
        if isinstance(item, Env):
            by_version[item.version_id].append(item)
        elif item.parent_env_id is not None:
            by_env[item.parent_env_id].append(item)
    keep = {item.id for item in chain}

    def grow(item: Env | Version) -> Node | None:
        found: list[Env] | list[Version] = (
            by_version[item.id] if isinstance(item, Version) else by_env[item.id]
        )
        kids: list[Env | Version] = sorted(found, key=lambda x: x.id)
        children = [n for k in kids if (n := grow(k)) is not None]
        deleted = isinstance(item, Env) and item.status is EnvStatus.DELETED
        if deleted and not children and not show_deleted and item.id not in keep:
            return None
        return Node(item, children)

    root = grow(chain[-1])
    assert root is not None  # the root is in `keep`
    return root


def _label(item: Env | Version, target: str) -> str:
    mark = "  [bold cyan]<<[/]" if item.id == target else ""
    if isinstance(item, Env):
        status = status_text(item.status)
        return f"[bold]{item.id}[/]  {status}  {item.start.value}  {age(item.created_at)}{mark}"
    what = item.project or " ".join(s.image for s in item.services)
    labels = f"  {escape(labels_text(item.labels))}" if item.labels else ""
    return f"[blue]{item.id}[/]  version of {escape(what)}  {age(item.created_at)}{labels}{mark}"


def render(node: Node, target: str, tree: Tree | None = None) -> Tree:
    """The tree as a rich `Tree`; `target` (the id asked for) is marked."""
    branch = (
        Tree(_label(node.item, target)) if tree is None else tree.add(_label(node.item, target))
    )
    for child in node.children:
        render(child, target, branch)
    return branch


def _add_tree(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "id", metavar="ENV_OR_VERSION", help="an env (env_...) or a version (ver_...)"
    )
    parser.add_argument(
        "--all", action="store_true", help="also show deleted envs that nothing grew from"
    )


def _tree(denv: Denv, args: argparse.Namespace, out: Output) -> int:
    if not args.id.startswith(("env_", "ver_")):
        out.error(f"denv tree: {args.id!r} is neither an env id (env_...) nor a version (ver_...)")
        return 2
    chain = denv.lineage(args.id)
    root = build_tree(
        chain,
        denv.list_versions(),
        denv.list_envs(include_deleted=True),
        show_deleted=args.all,
    )
    if out.as_json:
        out.json(root.to_dict())
    else:
        out.print(render(root, args.id))
    return 0


TREE = Command(_add_tree, _tree)
