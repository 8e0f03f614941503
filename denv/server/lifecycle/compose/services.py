"""One service of a compose file, key by key: image, command, environment, ports, volumes,
dependencies, healthcheck and the service's own limits.

``parse_service`` checks everything a service says on its own (and which service owns each
named volume); what needs the whole file (dependencies that exist, the agent service, the
start order) is checked by ``parse.parse_compose``. Every error names the key, as
``services.db.ports[0]``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from denv.server.lifecycle.compose.spec import SHORT, ComposeError, ComposeService

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


def parse_service(
    name: str, raw: Any, named: dict[str, Any], owners: dict[str, str]
) -> ComposeService:
    """A service's keys as a ``ComposeService``; ``owners`` records which service mounts
    each named volume (one service each)."""
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
    spec = ComposeService(name=name, image=image.strip())
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


def _limits(spec: ComposeService, raw: dict[str, Any], where: str) -> None:
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
                path, f"must be a whole number of processes >= 1, got {SHORT.repr(v)}"
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
                path, f"must be a number of CPUs such as 0.5 or 2, got {SHORT.repr(v)}"
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
        raise ComposeError(where, f"must be a size such as 512m or 2g, got {SHORT.repr(raw)}")
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
