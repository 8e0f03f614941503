"""YAML with bounds: ``yaml.safe_load`` that refuses alias bombs and deep nesting.

PyYAML shares an anchored value between its aliases, but anything that walks or prints
the value (``str()`` of a value, an error message) expands every alias, so a few hundred
bytes of nested anchors (a "billion laughs" file) would become gigabytes. Before any
Python value is built, ``load_bounded`` refuses nesting deeper than ``MAX_DEPTH`` and a
document whose aliases, written out, exceed ``MAX_EXPANDED`` nodes and characters.
"""

from __future__ import annotations

from typing import Any

import yaml

# A compose file nests about six levels deep; ten times that is still nothing to walk.
MAX_DEPTH = 64
# Nodes plus scalar characters of the document with every alias written out: four times
# the contract's 256 KiB compose limit, so a file without aliases always fits, and anchors
# merged into each service (``<<: *common``) fit many times over.
MAX_EXPANDED = 1 << 20


class BoundExceeded(ValueError):
    """The document passes a bound; ``path`` is where (``compose.x-bomb.b5``), ``problem`` why."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that stops at ``MAX_DEPTH`` while composing, before Python's stack runs out."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
                raise BoundExceeded(
                    "compose",
                    f"line {line} is nested deeper than {MAX_DEPTH} levels: "
                    "flatten the structure (compose files need a handful of levels)",
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_bounded(text: str) -> Any:
    """``yaml.safe_load`` with bounds: the node graph is checked before any value is built."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph that, with its aliases written out, is too large, deep or cyclic.

    Each node is measured once (an alias shares its anchor's node, so measures are kept by
    identity): its weight is 1 plus its scalar's length or its children's weights, its height
    1 plus its tallest child's. The cost is linear in the file, however large the expansion.
    The walk recurses no deeper than the file nests (the loader bounds that): an alias's
    anchor comes earlier in the file, so it was measured already, or is open (a cycle).
    """
    measured: dict[int, tuple[int, int]] = {}
    open_nodes: set[int] = set()

    def measure(node: yaml.Node, path: str) -> tuple[int, int]:
        ident = id(node)
        if ident in measured:
            return measured[ident]
        if ident in open_nodes:
            raise BoundExceeded(
                path,
                "a YAML alias refers to an anchor it is inside: values cannot contain themselves",
            )
        open_nodes.add(ident)
        children: list[tuple[int, int]] = []
        if isinstance(node, yaml.SequenceNode):
            children = [measure(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                children.append(measure(key, path))
                children.append(measure(value, name if path == "compose" else f"{path}.{name}"))
        open_nodes.discard(ident)
        weight = 1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else 0)
        weight += sum(w for w, _ in children)
        height = 1 + max((h for _, h in children), default=0)
        if weight > MAX_EXPANDED:
            raise BoundExceeded(
                path,
                f"YAML aliases expand this to more than {MAX_EXPANDED} nodes and characters "
                "(an alias bomb): write the values out, or use each anchor a few times "
                "rather than nesting aliases inside anchors",
            )
        if height > MAX_DEPTH:
            raise BoundExceeded(
                path,
                f"nested deeper than {MAX_DEPTH} levels once YAML aliases are written out: "
                "flatten the structure or nest fewer aliases inside anchors",
            )
        measured[ident] = weight, height
        return weight, height

    measure(root, "compose")
