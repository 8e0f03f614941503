"""The files of an export, rendered in memory from the plan (nothing touches the disk here).

An OpenEnv package and a Harbor task share the server (the `runtime` package, copied as
`server/`), `denv-version.json` and the Dockerfile template; a Harbor task adds a start
script for its container, an instruction and a verifier.
"""

from __future__ import annotations

import json
from importlib import metadata, resources
from string import Template
from typing import Any

from ._plan import BASE_CHECK, CONTENT, ExportPlan, base_check_script

#: relative path -> (content, file mode)
Files = dict[str, tuple[bytes, int]]

RUNTIME_MODULES = (
    "__init__.py",
    "__main__.py",
    "app.py",
    "denv_api.py",
    "environment.py",
    "episode.py",
    "inner.py",
    "tools.py",
)
_PIN_NOTES = {
    "registry digest": "",
    CONTENT: (
        "Local images have no registry digest, and BuildKit cannot build FROM a bare image id:\n"
        "# FROM names the tag `denv export` put on the image (its id), and the build checks\n"
        "# that the base's files are the image's (denv-base-check.py). On another engine,\n"
        "# docker load the image and tag it so. After pushing it to a registry, write\n"
        "# `FROM repo@sha256:<registry digest>` instead and drop the check."
    ),
}
_MISSING_NOTE = (
    "The image is not on the Docker Engine this was exported on: load it (docker load)\n"
    "# or pull it before building, or replace FROM with its registry digest."
)
_CHECK = """\
# A tag can be put on any image: the build goes on only when the base's files are those of
# the image the version was exported from (their digest, taken by `denv export`).
COPY {script} /{script}
RUN python3 -I -B /{script} {digest} && rm -f /{script}
"""


#: The Harbor image's additions: the unprivileged user the agent runs as (written into
#: /etc/passwd when the base has none, since not every base has useradd), and the folder of
#: the env service's reward log.
_HARBOR_EXTRA = """\
RUN set -eu; \\
    if ! id agent >/dev/null 2>&1; then \\
      echo 'agent:x:10001:10001:agent:/home/agent:/bin/sh' >> /etc/passwd; \\
      echo 'agent:x:10001:' >> /etc/group; \\
      mkdir -p /home/agent; chown 10001:10001 /home/agent; \\
    fi; \\
    mkdir -p /var/lib/denv-export; chmod 1777 /var/lib/denv-export"""


def _template(name: str) -> Template:
    text = resources.files(__package__).joinpath("templates", name).read_text()
    return Template(text)


def _render(name: str, values: dict[str, Any]) -> bytes:
    return _template(name).substitute(values).encode()


def _runtime_module(module: str) -> bytes:
    return resources.files(__package__).joinpath("runtime", module).read_bytes()


def _runtime(prefix: str) -> Files:
    return {
        f"{prefix}server/{module}": (_runtime_module(module), 0o644) for module in RUNTIME_MODULES
    }


def _requirements() -> bytes:
    try:
        openenv = f"openenv=={metadata.version('openenv')}"
    except metadata.PackageNotFoundError:
        openenv = "openenv>=0.10"
    return (
        "# What the exported server needs (installed only when the base image lacks it).\n"
        f"{openenv}\nhttpx\nuvicorn\nwebsockets\n"
    ).encode()


def _values(plan: ExportPlan, ref: str) -> dict[str, Any]:
    pin = plan.agent
    return {
        "ref": ref,
        "name": plan.name,
        "version_id": plan.version_id,
        "agent_service": plan.agent_service,
        "agent_port": plan.agent_port,
        "health_path": plan.health_path,
        "agent_image": pin.image,
        "agent_image_id": pin.image_id,
        "base_ref": pin.reference,
        "pin_kind": pin.kind,
        "pin_note": _PIN_NOTES.get(pin.kind, _MISSING_NOTE),
        "base_check": _CHECK.format(script=BASE_CHECK, digest=pin.files_digest)
        if pin.kind == CONTENT
        else "",
        "image_name": plan.name.replace("_", "-") + ":latest",
        "tools": ", ".join(f"`{t}`" for t in plan.tools)
        if plan.tools
        else ("none declared" if plan.tools is not None else "every tool the env lists"),
    }


def _dockerfile(values: dict[str, Any], *, harbor: bool, user: str) -> bytes:
    extra = ""
    if harbor:
        extra = _HARBOR_EXTRA
    build = (
        "docker build -t IMAGE environment/   (Harbor: docker compose build)"
        if harbor
        else f"docker build -f server/Dockerfile -t {values['image_name']} ."
    )
    return _render(
        "Dockerfile.tmpl",
        {
            **values,
            "title": f"denv version {values['version_id']} "
            + ("as a Harbor task environment" if harbor else "as an OpenEnv environment"),
            "context_dir": "the task's environment/ folder" if harbor else "the package root",
            "build_command": build,
            "requirements": "requirements.txt" if harbor else "server/requirements.txt",
            "extra": extra,
            "user_line": f"USER {user}" if user and user not in ("root", "0") else "",
        },
    )


def _version_json(plan: ExportPlan) -> bytes:
    return (json.dumps(plan.version_facts(), indent=2) + "\n").encode()


def openenv_files(plan: ExportPlan, ref: str) -> Files:
    """An OpenEnv environment package (the layout of `openenv init`)."""
    values = _values(plan, ref)
    services = ", ".join(f"`{p.service}` ({p.image})" for p in plan.services)
    project_note = f" (project `{plan.project}`)" if plan.project else ""
    pin_readme = _PIN_NOTES.get(plan.agent.kind, _MISSING_NOTE).replace("\n# ", " ")
    deps = ", ".join(json.dumps(d) for d in _requirements().decode().splitlines()[1:])
    files: Files = {
        "openenv.yaml": (
            _render(
                "openenv.yaml.tmpl",
                {
                    **values,
                    "declared_tools": f"    declared_tools: {json.dumps(plan.tools)}"
                    if plan.tools
                    else "",
                },
            ),
            0o644,
        ),
        "README.md": (
            _render(
                "README.md.tmpl",
                {
                    **values,
                    "services": services,
                    "project_note": project_note,
                    "pin_readme": pin_readme,
                },
            ),
            0o644,
        ),
        "pyproject.toml": (
            _render(
                "pyproject.toml.tmpl",
                {**values, "dist_name": plan.name.replace("_", "-"), "dependencies": deps},
            ),
            0o644,
        ),
        "denv-version.json": (_version_json(plan), 0o644),
        "server/requirements.txt": (_requirements(), 0o644),
        "server/Dockerfile": (
            _dockerfile(values, harbor=False, user=plan.agent.user),
            0o644,
        ),
    }
    files.update(_runtime(""))
    files[".dockerignore"] = (b"**/__pycache__\n", 0o644)
    if plan.agent.kind == CONTENT:
        files[BASE_CHECK] = (base_check_script(), 0o644)
    return files


def _toml(value: Any) -> str:
    """A TOML value: strings, lists of strings, or an empty string for None."""
    if value is None:
        return '""'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def harbor_files(plan: ExportPlan, ref: str) -> Files:
    """A Harbor task: task.toml, instruction.md, environment/ (Dockerfile pinned), tests/."""
    values = _values(plan, ref)
    org = "denv"
    task_values = {
        **values,
        "task_name": _toml(f"{org}/{plan.name.replace('_', '-')}"),
        "description": _toml(
            f"denv version {plan.version_id}: an OpenEnv environment whose every reset "
            "starts from the version's state"
        ),
        "version_id_toml": _toml(plan.version_id),
        "project_toml": _toml(plan.project),
        "agent_service_toml": _toml(plan.agent_service),
        "agent_image_toml": _toml(plan.agent.image),
        "agent_image_id_toml": _toml(plan.agent.image_id),
        "tools_toml": _toml(plan.tools or []),
    }
    files: Files = {
        "task.toml": (_render("harbor/task.toml.tmpl", task_values), 0o644),
        "instruction.md": (_render("harbor/instruction.md.tmpl", values), 0o644),
        "environment/Dockerfile": (
            _dockerfile(values, harbor=True, user=plan.agent.user),
            0o644,
        ),
        "environment/denv-version.json": (_version_json(plan), 0o644),
        "environment/requirements.txt": (_requirements(), 0o644),
        "environment/docker-compose.yaml": (
            _render("harbor/docker-compose.yaml.tmpl", values),
            0o644,
        ),
        "tests/Dockerfile": (_render("harbor/tests.Dockerfile.tmpl", values), 0o644),
        "tests/test.sh": (_render("harbor/test.sh.tmpl", values), 0o755),
        "tests/score.py": (_render("harbor/score.py.tmpl", values), 0o644),
        "tests/episode.py": (_runtime_module("episode.py"), 0o644),
    }
    files.update(_runtime("environment/"))
    if plan.agent.kind == CONTENT:
        files[f"environment/{BASE_CHECK}"] = (base_check_script(), 0o644)
        files[f"tests/{BASE_CHECK}"] = (base_check_script(), 0o644)
    return files
