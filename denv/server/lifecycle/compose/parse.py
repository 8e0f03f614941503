"""The compose subset denv deploys, parsed and validated.

Supported: top-level ``services``, ``volumes``, ``name``, ``version``, ``x-*`` and
``x-denv.agent.service`` (required; optional ``x-denv.agent.health_path`` and
``x-denv.agent.fork``: ``warm`` when every service reads its volumes per session, so
children may start from booted spares, ``cold`` when not), and ``x-denv.tools`` (the MCP
tools the agent service declares, kept on the version). Per service:
``image`` (required), ``command``, ``environment``, ``ports``, ``volumes`` (named or anonymous,
never host paths), ``depends_on``, ``healthcheck``, and the service's own limits within the
server's (``mem_limit``, ``pids_limit``, ``cpus``, or ``deploy.resources.limits`` with
``memory``, ``pids``, ``cpus``). Every error names the offending key, for example
``services.db.image: required``.

YAML anchors and aliases are read, within bounds: PyYAML shares an anchored value between
its aliases, but anything that walks or prints the value (``str()`` of an environment
value, a message) expands every alias, so a few hundred bytes of nested anchors (a
"billion laughs" file) would become gigabytes. Before anything is built, the loader
refuses nesting deeper than ``MAX_DEPTH`` and a document whose aliases, written out,
exceed ``MAX_EXPANDED`` nodes and characters (``bounded_yaml``).

Here: the document's keys, ``x-denv`` and what needs every service (dependencies, start
order). Each service's own keys are parsed in ``services``; the records built are in
``spec``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from denv.server.lifecycle.compose.bounded_yaml import BoundExceeded, load_bounded
from denv.server.lifecycle.compose.services import parse_service
from denv.server.lifecycle.compose.spec import SHORT, ComposeError, ComposeService, ComposeSpec

# What importers take from here: the parser and what it returns or raises.
__all__ = ["ComposeError", "ComposeService", "ComposeSpec", "parse_compose"]

SERVICE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
#: x-denv.tools: names of MCP tools (they end up in exported file and package names too).
TOOL_NAME = SERVICE_NAME
MAX_TOOLS = 256
_TOP_KEYS = {"services", "volumes", "name", "version"}


def parse_compose(text: str) -> ComposeSpec:
    """Parse and validate a compose file; raises :class:`ComposeError` naming the key."""
    try:
        doc = load_bounded(text)
    except BoundExceeded as exc:
        raise ComposeError(exc.path, exc.problem) from None
    except yaml.YAMLError as exc:
        raise ComposeError("compose", f"not valid YAML ({exc})") from exc
    if not isinstance(doc, dict):
        raise ComposeError("compose", "must be a mapping with a 'services' key")
    for key in doc:
        if not isinstance(key, str) or (key not in _TOP_KEYS and not key.startswith("x-")):
            raise ComposeError(str(key), f"not supported (supported: {sorted(_TOP_KEYS)}, x-*)")
    raw_services = doc.get("services")
    if not isinstance(raw_services, dict) or not raw_services:
        raise ComposeError("services", "required: a mapping of at least one service")
    named = doc.get("volumes") or {}
    if not isinstance(named, dict):
        raise ComposeError("volumes", "must be a mapping of volume names")
    services: dict[str, ComposeService] = {}
    owners: dict[str, str] = {}
    for name, raw in raw_services.items():
        if not isinstance(name, str) or not SERVICE_NAME.match(name):
            raise ComposeError(
                f"services.{name}",
                "service names are letters, digits, _.- "
                "(starting with a letter or digit, at most 63)",
            )
        services[name] = parse_service(name, raw, named, owners)
    agent, health_path, fork = _agent(doc.get("x-denv"), services)
    for svc in services.values():
        for dep in svc.depends_on:
            where = f"services.{svc.name}.depends_on"
            if dep not in services:
                raise ComposeError(where, f"no service named '{dep}'")
            if dep == svc.name:
                raise ComposeError(where, "a service cannot depend on itself")
            mapping_form = isinstance(raw_services[svc.name]["depends_on"], dict)
            if dep in svc.wait_healthy and services[dep].healthcheck is None and mapping_form:
                raise ComposeError(
                    f"{where}.{dep}.condition",
                    f"service_healthy needs a healthcheck on '{dep}'",
                )
    tools = _tools(doc["x-denv"])  # a mapping: _agent checked it
    return ComposeSpec(agent, health_path, _order(services), fork, tools)


def _tools(raw: dict[str, Any]) -> list[str] | None:
    """x-denv.tools: tool names, or mappings with a `name` (as OpenEnv lists tools)."""
    tools = raw.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ComposeError("x-denv.tools", f"must be a list of at most {MAX_TOOLS} tool names")
    names = []
    for i, tool in enumerate(tools):
        name = tool.get("name") if isinstance(tool, dict) else tool
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise ComposeError(
                f"x-denv.tools[{i}]",
                f"a tool name is letters, digits and _.- (at most 63), got {SHORT.repr(name)}",
            )
        names.append(name)
    return list(dict.fromkeys(names))


def _agent(raw: Any, services: dict[str, ComposeService]) -> tuple[str, str, str | None]:
    if not isinstance(raw, dict) or not isinstance(raw.get("agent"), dict):
        raise ComposeError(
            "x-denv.agent.service",
            "required: name the service clients talk to (the OpenEnv server)",
        )
    agent = raw["agent"]
    name = agent.get("service")
    if not isinstance(name, str) or name not in services:
        raise ComposeError(
            "x-denv.agent.service",
            f"must name one of the services {sorted(services)}, got {SHORT.repr(name)}",
        )
    health = agent.get("health_path", "/health")
    if not isinstance(health, str) or not health.startswith("/"):
        raise ComposeError("x-denv.agent.health_path", "must be a path starting with '/'")
    fork = agent.get("fork")
    if fork not in (None, "warm", "cold"):
        raise ComposeError("x-denv.agent.fork", f"must be 'warm' or 'cold', got {SHORT.repr(fork)}")
    if not services[name].ports:
        raise ComposeError(
            f"services.{name}.ports", "the agent service must expose at least one port"
        )
    return name, health, fork


def _order(services: dict[str, ComposeService]) -> list[ComposeService]:
    """Dependencies first; a cycle is an error naming a service on it."""
    done: dict[str, bool] = {}
    out: list[ComposeService] = []

    def visit(name: str, trail: list[str]) -> None:
        if done.get(name):
            return
        if name in trail:
            raise ComposeError(
                f"services.{name}.depends_on", f"dependency cycle: {' -> '.join([*trail, name])}"
            )
        for dep in services[name].depends_on:
            visit(dep, [*trail, name])
        done[name] = True
        out.append(services[name])

    for name in services:
        visit(name, [])
    return out
