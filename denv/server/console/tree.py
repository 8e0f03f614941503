"""The console's view of a key's records: one node per env and per version, linked as
``denv tree`` links them (an env under the version it started from, a version under the env
it was snapshotted from), and the changes between two views.

The browser builds the trees, the env list and the version list from these nodes; the
server pushes them (``console.events``): the whole view first, then only what changed.
A deleted env or version stays in the view only where something live grew from it.
"""

from __future__ import annotations

from typing import Any

from denv.ingress_host import web_url
from denv.server.db import Store
from denv.server.records import EnvRecord, EnvStatus, VersionRecord
from denv.server.tokens import IngressKeys

Node = dict[str, Any]
#: More than one key holds: the view reads them all in one query each.
ALL = 1_000_000
WEB_FLAG = "ENABLE_WEB_INTERFACE"


def _compact(node: Node) -> Node:
    """``node`` without its empty fields (None, False): a view of 1,000 nodes is read by
    the browser at every page load, so it carries only what is said."""
    return {k: v for k, v in node.items() if v is not None and v is not False}


def _web_enabled(rec: EnvRecord, version: VersionRecord | None) -> bool:
    values = [rec.spec.env.get(WEB_FLAG, "")]
    if version is not None:
        values += [s.env.get(WEB_FLAG, "") for s in version.services if s.name == rec.agent_service]
    return any(v.lower() in ("1", "true", "yes") for v in values)


def env_node(
    rec: EnvRecord, version: VersionRecord | None, base_url: str, keys: IngressKeys | None
) -> Node:
    """What the console shows of an env."""
    image = ""
    if version is not None:
        image = rec.project or next(
            (s.image for s in version.services if s.name == rec.agent_service), ""
        )
    url = web = None
    if rec.status != EnvStatus.DELETED and keys is not None:
        ingress = [e for e in rec.runtime.endpoints if e.via == "ingress"]
        agent = [e for e in ingress if e.service == rec.agent_service] or ingress
        if agent:
            e = agent[0]
            url = f"{base_url}/ingress/{e.token or keys.token(rec.id, e.service, e.port)}"
            web = web_url(url, "/web/") if _web_enabled(rec, version) else None
        elif rec.runtime.endpoints:  # egress allow: published directly
            url = rec.runtime.endpoints[0].url
    return _compact(
        {
            "id": rec.id,
            "kind": "env",
            "parent": rec.version_id,
            "status": rec.status.value,
            "start": rec.start,
            "live": bool(rec.spec.live and rec.runtime.live_unsupported is None),
            "node": rec.runtime.node,
            "image": image,
            "created_at": rec.created_at,
            "url": url,
            "web": web,
            "error": rec.error.message if rec.error else None,
        }
    )


def version_node(rec: VersionRecord) -> Node:
    """What the console shows of a version."""
    return _compact(
        {
            "id": rec.id,
            "kind": "version",
            "parent": rec.parent_env_id,
            "status": "deleted" if rec.deleted else "ready",
            "project": rec.project,
            "image": next((s.image for s in rec.services if s.name == rec.agent_service), ""),
            "layers": max((len(v.layers) for v in rec.volumes), default=0),
            "size": rec.size_bytes,
            "created_at": rec.created_at,
        }
    )


def view(store: Store, owner: str, base_url: str, keys: IngressKeys | None) -> dict[str, Node]:
    """Every live env and version of ``owner``, and the deleted ones that link them."""
    versions = {v.id: v for v in store.list_versions(owner, ALL, None, None)}
    envs = {e.id: e for e in store.list_envs(owner, ALL, None, None, None, False)}
    # Deleted links: a version's env, an env's version; each chain walked up once.
    missing = {v.parent_env_id for v in versions.values() if v.parent_env_id} - envs.keys()
    missing |= {e.version_id for e in envs.values()} - versions.keys()
    seen: set[str] = set()
    while missing:
        some = missing.pop()
        seen.add(some)
        if some.startswith("env_"):
            env = store.get_env(some)
            if env is not None and env.owner == owner:
                envs[env.id] = env
                if env.version_id not in versions and env.version_id not in seen:
                    missing.add(env.version_id)
        else:
            ver = store.get_version(some, include_deleted=True)
            if ver is not None and ver.owner == owner:
                versions[ver.id] = ver
                up = ver.parent_env_id
                if up and up not in envs and up not in seen:
                    missing.add(up)
    nodes: dict[str, Node] = {v.id: version_node(v) for v in versions.values()}
    for e in envs.values():
        nodes[e.id] = env_node(e, versions.get(e.version_id), base_url, keys)
    return nodes


def changes(before: dict[str, Node], after: dict[str, Node]) -> dict[str, list[Any]]:
    """What turns ``before`` into ``after``: nodes new or changed, ids gone."""
    upsert = [n for i, n in after.items() if before.get(i) != n]
    remove = [i for i in before if i not in after]
    return {"upsert": upsert, "remove": remove}


def subtree(nodes: dict[str, Node], root: str) -> list[str]:
    """The ids under ``root`` (itself included), deepest first: the order to delete them."""
    children: dict[str, list[str]] = {}
    for n in nodes.values():
        if n.get("parent"):
            children.setdefault(n["parent"], []).append(n["id"])
    order: list[str] = []
    stack = [root]
    while stack:
        at = stack.pop()
        order.append(at)
        stack.extend(children.get(at, []))
    return order[::-1]
