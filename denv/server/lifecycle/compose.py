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
"""

from __future__ import annotations

import re
import reprlib
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from denv.server.errors import ApiError
from denv.server.lifecycle.bounded_yaml import BoundExceeded, load_bounded

SERVICE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
#: x-denv.tools: names of MCP tools (they end up in exported file and package names too).
TOOL_NAME = SERVICE_NAME
MAX_TOOLS = 256
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_SERVICE_KEYS = {
    *("image", "command", "environment", "ports", "volumes", "depends_on", "healthcheck"),
    *("mem_limit", "pids_limit", "cpus", "deploy"),
}
# A size: bytes, or a number with b, k, m or g (compose's units, kb/mb/gb spellings too).
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([bkmg]?)b?$", re.IGNORECASE)
_UNIT = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
MIN_MEMORY_MB = 6  # Docker refuses a smaller memory limit
MAX_CPUS = 1024.0
_IGNORED_SERVICE_KEYS = {"restart", "stop_grace_period", "stop_signal"}
_TOP_KEYS = {"services", "volumes", "name", "version"}
_SHORT = reprlib.Repr()  # for values in messages: a shared structure is never written out
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 2, 3, 3
_SHORT.maxstring = _SHORT.maxother = 40


class ComposeError(ApiError):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(422, "invalid_compose", f"{path}: {problem}", {"path": path})


@dataclass
class ServiceSpec:
    name: str
    image: str
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)  # container paths
    depends_on: list[str] = field(default_factory=list)
    wait_healthy: list[str] = field(default_factory=list)  # dependencies to wait healthy for
    healthcheck: list[str] | None = None  # argv run with docker exec
    # The service's own limits (None: the server's); checked against the server's at deploy.
    memory_mb: int | None = None
    pids: int | None = None
    cpus: float | None = None


@dataclass
class ComposeSpec:
    agent_service: str
    health_path: str
    services: list[ServiceSpec]  # in start order (dependencies first)
    fork: str | None = None  # x-denv.agent.fork: "warm", "cold", or None (undeclared)
    tools: list[str] | None = None  # x-denv.tools: the MCP tools it declares, None: none said


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
    services: dict[str, ServiceSpec] = {}
    owners: dict[str, str] = {}
    for name, raw in raw_services.items():
        if not isinstance(name, str) or not SERVICE_NAME.match(name):
            raise ComposeError(
                f"services.{name}",
                "service names are letters, digits, _.- "
                "(starting with a letter or digit, at most 63)",
            )
        services[name] = _service(name, raw, named, owners)
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
                f"a tool name is letters, digits and _.- (at most 63), got {_SHORT.repr(name)}",
            )
        names.append(name)
    return list(dict.fromkeys(names))


def _agent(raw: Any, services: dict[str, ServiceSpec]) -> tuple[str, str, str | None]:
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
            f"must name one of the services {sorted(services)}, got {_SHORT.repr(name)}",
        )
    health = agent.get("health_path", "/health")
    if not isinstance(health, str) or not health.startswith("/"):
        raise ComposeError("x-denv.agent.health_path", "must be a path starting with '/'")
    fork = agent.get("fork")
    if fork not in (None, "warm", "cold"):
        raise ComposeError(
            "x-denv.agent.fork", f"must be 'warm' or 'cold', got {_SHORT.repr(fork)}"
        )
    if not services[name].ports:
        raise ComposeError(
            f"services.{name}.ports", "the agent service must expose at least one port"
        )
    return name, health, fork


def _service(name: str, raw: Any, named: dict[str, Any], owners: dict[str, str]) -> ServiceSpec:
    where = f"services.{name}"
    if not isinstance(raw, dict):
        raise ComposeError(where, "must be a mapping")
    for key in raw:
        if key not in _SERVICE_KEYS and key not in _IGNORED_SERVICE_KEYS:
            raise ComposeError(
                f"{where}.{key}", f"not supported by denv (supported: {sorted(_SERVICE_KEYS)})"
            )
    image = raw.get("image")
    if not isinstance(image, str) or not image.strip():
        raise ComposeError(f"{where}.image", "required: the image to run (already on the engine)")
    spec = ServiceSpec(name=name, image=image.strip())
    spec.command = _command(raw.get("command"), f"{where}.command")
    spec.env = _environment(raw.get("environment"), f"{where}.environment")
    spec.ports = [_port(p, f"{where}.ports[{i}]") for i, p in enumerate(_list(raw, "ports", where))]
    for i, v in enumerate(_list(raw, "volumes", where)):
        spec.volumes.append(_volume(v, f"{where}.volumes[{i}]", name, named, owners))
    if len(set(spec.volumes)) != len(spec.volumes):
        raise ComposeError(f"{where}.volumes", "a container path is mounted twice")
    spec.depends_on, spec.wait_healthy = _depends(raw.get("depends_on"), f"{where}.depends_on")
    spec.healthcheck = _healthcheck(raw.get("healthcheck"), f"{where}.healthcheck")
    _limits(spec, raw, where)
    return spec


def _limits(spec: ServiceSpec, raw: dict[str, Any], where: str) -> None:
    """``mem_limit``/``pids_limit``/``cpus``, or the same under ``deploy.resources.limits``."""
    given: dict[str, tuple[str, Any]] = {}
    for key, name in (("mem_limit", "memory"), ("pids_limit", "pids"), ("cpus", "cpus")):
        if raw.get(key) is not None:
            given[name] = (f"{where}.{key}", raw[key])
    deploy = raw.get("deploy")
    if deploy is not None:
        here = f"{where}.deploy"
        for key, value in _only(deploy, here, {"resources"}).items():
            limits = _only(value, f"{here}.{key}", {"limits"}).get("limits")
            here = f"{here}.resources.limits"
            for name, v in _only(limits, here, {"memory", "pids", "cpus"}).items():
                if name in given and v is not None:
                    raise ComposeError(
                        f"{here}.{name}", f"{name} is also set by {given[name][0]}: set it once"
                    )
                if v is not None:
                    given[name] = (f"{here}.{name}", v)
    if "memory" in given:
        spec.memory_mb = _memory_mb(*given["memory"])
    if "pids" in given:
        path, v = given["pids"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ComposeError(
                path, f"must be a whole number of processes >= 1, got {_SHORT.repr(v)}"
            )
        spec.pids = v
    if "cpus" in given:
        path, v = given["cpus"]
        try:
            cpus = float(v) if not isinstance(v, bool) and isinstance(v, int | float | str) else 0.0
        except ValueError:
            cpus = 0.0
        if not 0.01 <= cpus <= MAX_CPUS:
            raise ComposeError(
                path, f"must be a number of CPUs such as 0.5 or 2, got {_SHORT.repr(v)}"
            )
        spec.cpus = cpus


def _only(raw: Any, where: str, keys: set[str]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ComposeError(where, "must be a mapping")
    for key in raw:
        if key not in keys:
            raise ComposeError(
                f"{where}.{key}", f"not supported by denv (supported: {sorted(keys)})"
            )
    return raw


def _memory_mb(where: str, raw: Any) -> int:
    """A compose size ("512m", "1g", bytes) in MiB, rounded up."""
    match = _SIZE.match(raw.strip()) if isinstance(raw, str) else None
    if isinstance(raw, int) and not isinstance(raw, bool):
        size = float(raw)
    elif match:
        size = float(match.group(1)) * _UNIT[match.group(2).lower()]
    else:
        raise ComposeError(where, f"must be a size such as 512m or 2g, got {_SHORT.repr(raw)}")
    mb = -(-int(size) // (1024 * 1024))
    if mb < MIN_MEMORY_MB:
        raise ComposeError(where, f"must be at least {MIN_MEMORY_MB}m (Docker's minimum)")
    return mb


def _list(raw: dict[str, Any], key: str, where: str) -> list[Any]:
    value = raw.get(key) or []
    if not isinstance(value, list):
        raise ComposeError(f"{where}.{key}", "must be a list")
    return value


def _command(raw: Any, where: str) -> list[str] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            return shlex.split(raw)
        except ValueError as exc:
            raise ComposeError(where, f"cannot split into words ({exc})") from exc
    if isinstance(raw, list) and all(isinstance(x, str | int | float) for x in raw):
        return [str(x) for x in raw]
    raise ComposeError(where, "must be a string or a list of strings")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _environment(raw: Any, where: str) -> dict[str, str]:
    env: dict[str, str] = {}
    if raw is None:
        return env
    if isinstance(raw, dict):
        for k, v in raw.items():
            if isinstance(v, list | dict):  # as docker compose: a value is one scalar
                raise ComposeError(f"{where}.{k}", "must be a string, number, boolean or null")
        items = [(str(k), _scalar(v)) for k, v in raw.items()]
    elif isinstance(raw, list):
        items = []
        for i, entry in enumerate(raw):
            if not isinstance(entry, str):
                raise ComposeError(f"{where}[{i}]", "must be a 'NAME=value' string")
            k, _, v = entry.partition("=")
            items.append((k, v))
    else:
        raise ComposeError(where, "must be a mapping or a list of 'NAME=value'")
    for k, v in items:
        if not ENV_NAME.match(k):
            raise ComposeError(f"{where}.{k}", "variable names are letters, digits and _")
        env[k] = v
    return env


def _port(raw: Any, where: str) -> int:
    text = str(raw) if isinstance(raw, int | str) and not isinstance(raw, bool) else None
    if text is None:
        raise ComposeError(where, "must be a port number or 'host:container' string")
    text, _, proto = text.partition("/")
    if proto and proto != "tcp":
        raise ComposeError(where, f"only tcp ports are supported, got '{proto}'")
    container = text.rsplit(":", 1)[-1]
    if not container.isdigit() or not 1 <= int(container) <= 65535:
        raise ComposeError(where, f"'{raw}' has no valid container port (1-65535)")
    return int(container)


def _volume(
    raw: Any, where: str, service: str, named: dict[str, Any], owners: dict[str, str]
) -> str:
    if isinstance(raw, dict):
        if raw.get("type", "volume") != "volume":
            raise ComposeError(f"{where}.type", "only volumes are supported, not host binds")
        source, target = raw.get("source"), raw.get("target")
    elif isinstance(raw, str):
        parts = raw.split(":")
        if len(parts) == 1:
            source, target = None, parts[0]
        elif len(parts) in (2, 3):
            source, target = parts[0], parts[1]
        else:
            raise ComposeError(where, f"'{raw}' is not 'name:/path' or '/path'")
    else:
        raise ComposeError(where, "must be a string or a mapping")
    if not isinstance(target, str) or not target.startswith("/") or "\x00" in target:
        raise ComposeError(where, "the container path must be absolute")
    if source is not None:
        if not isinstance(source, str) or source.startswith((".", "/", "~")):
            raise ComposeError(where, "host paths cannot be mounted: use a named volume")
        if source not in named:
            raise ComposeError(where, f"volume '{source}' is not declared in top-level volumes")
        if owners.setdefault(source, service) != service:
            raise ComposeError(
                where,
                f"volume '{source}' is already used by service "
                f"'{owners[source]}'; denv gives each service its own volumes",
            )
    return target.rstrip("/") or "/"


def _depends(raw: Any, where: str) -> tuple[list[str], list[str]]:
    """(dependencies, those to wait healthy for: list form waits when a healthcheck exists)."""
    if raw is None:
        return [], []
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return list(raw), list(raw)
    if isinstance(raw, dict):
        deps, healthy = [], []
        for dep, cond in raw.items():
            deps.append(str(dep))
            condition = (
                (cond or {}).get("condition", "service_started")
                if isinstance(cond, dict | type(None))
                else None
            )
            if condition not in (
                "service_started",
                "service_healthy",
                "service_completed_successfully",
            ):
                raise ComposeError(
                    f"{where}.{dep}.condition", "must be service_started or service_healthy"
                )
            if condition == "service_healthy":
                healthy.append(str(dep))
        return deps, healthy
    raise ComposeError(where, "must be a list of service names or a mapping")


def _healthcheck(raw: Any, where: str) -> list[str] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ComposeError(where, "must be a mapping with 'test'")
    if raw.get("disable"):
        return None
    test = raw.get("test")
    if isinstance(test, str):
        return ["sh", "-c", test]
    if isinstance(test, list) and test and all(isinstance(x, str) for x in test):
        kind, args = test[0], test[1:]
        if kind == "NONE":
            return None
        if kind == "CMD" and args:
            return args
        if kind == "CMD-SHELL" and len(args) == 1:
            return ["sh", "-c", args[0]]
    raise ComposeError(f"{where}.test", "must be a string, ['CMD', ...] or ['CMD-SHELL', cmd]")


def _order(services: dict[str, ServiceSpec]) -> list[ServiceSpec]:
    """Dependencies first; a cycle is an error naming a service on it."""
    done: dict[str, bool] = {}
    out: list[ServiceSpec] = []

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
