"""What an export writes, decided before anything is written.

`resolve_version` turns `PROJECT@VERSION`, `PROJECT@latest` or `ver_...` into a stored
version; `make_plan` checks it (an agent service with a port, names that are safe as file
and package names) and pins each service's image. Every problem is an `ExportError` that
names it and the fix.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml

from denv.errors import NotFound

if TYPE_CHECKING:
    from denv import Denv, Version

#: Names that end up in file names, package names or generated code: no path separators,
#: no `..`, nothing a shell or TOML string would need to quote.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
VERSION_ID = re.compile(r"^ver_[0-9A-HJKMNP-TV-Z]{26}$")
#: The repository of the tags `pin_content` puts on export bases (tag: the image id's hex).
BASE_REPOSITORY = "denv-export-base"
#: The kind of pin of an image pinned by that tag plus the digest of its files.
CONTENT = "image content"
#: The script that takes that digest, shipped in every export beside the Dockerfile.
BASE_CHECK = "denv-base-check.py"


class ExportError(Exception):
    """The export cannot go ahead; nothing was written."""


@dataclass(frozen=True)
class ImagePin:
    """A service's image and the reference that pins it in a Dockerfile's FROM."""

    service: str
    image: str
    image_id: str
    #: What FROM names: `repo@sha256:...` when the engine knows a registry digest, else
    #: (agent images) the tag `denv-export-base:<image id hex>`, else the image id.
    reference: str
    #: "registry digest", "image content" (the tag plus `files_digest`, checked by the
    #: build), "image id" or "image id (not on this Docker Engine)".
    kind: str
    user: str = ""
    #: The digest of the image's files (templates/denv-base-check.py) for "image content".
    files_digest: str = ""


@dataclass(frozen=True)
class ExportPlan:
    version_id: str
    project: str | None
    name: str
    agent_service: str
    agent_port: int
    health_path: str
    tools: list[str] | None
    agent: ImagePin
    services: list[ImagePin]
    version: dict[str, Any] = field(repr=False)

    def version_facts(self) -> dict[str, Any]:
        """denv-version.json: what the exported server needs, and no credentials."""
        return {
            "format": 1,
            "name": self.name,
            "version_id": self.version_id,
            "project": self.project,
            "agent_service": self.agent_service,
            "agent_port": self.agent_port,
            "health_path": self.health_path,
            "tools": self.tools,
            "reset": "version",
            "services": [
                {"name": p.service, "image": p.image, "image_id": p.image_id} for p in self.services
            ],
        }


def parse_ref(ref: str) -> tuple[str | None, str]:
    """(project or None, id or "latest") of `PROJECT@VERSION`, `PROJECT@latest`, `ver_...`."""
    project, sep, version = ref.partition("@")
    if not sep:
        project, version = "", ref
    if not sep and not VERSION_ID.match(version):
        raise ExportError(
            f"{ref!r} is not PROJECT@VERSION, PROJECT@latest or a version id (ver_...): "
            "list versions with Denv().list_versions()"
        )
    if sep and not project:
        raise ExportError(f"{ref!r} has no project before '@': write PROJECT@{version}")
    if version != "latest" and not VERSION_ID.match(version):
        raise ExportError(
            f"{version!r} in {ref!r} is not a version id (ver_ and 26 characters) or 'latest'"
        )
    return project or None, version


def resolve_version(client: Denv, ref: str) -> Version:
    """The stored version `ref` names, or an ExportError saying what is missing."""
    project, version_id = parse_ref(ref)
    if version_id == "latest":
        assert project is not None
        found = next((p for p in client.list_projects() if p.name == project), None)
        if found is None:
            names = sorted(p.name for p in client.list_projects())
            raise ExportError(
                f"no project named {project!r} on {client.server} "
                f"(projects: {', '.join(names) or 'none'}): deploy it first"
            )
        version_id = found.latest_version_id
    try:
        version = client.get_version(version_id)
    except NotFound as exc:
        raise ExportError(
            f"no version {version_id} on {client.server}: check the id "
            "(Denv().list_versions() lists them)"
        ) from exc
    if project is not None and version.project != project:
        raise ExportError(
            f"version {version_id} belongs to project {version.project or '(none)'}, "
            f"not {project!r}: write {version.project}@{version_id} or the bare id"
            if version.project
            else f"version {version_id} is not a version of project {project!r} "
            "(it was snapshotted from a sandbox): pass the bare id"
        )
    return version


def check_name(what: str, name: str) -> str:
    """`name` if it is safe as a file or package name, else an ExportError."""
    if not isinstance(name, str) or not SAFE_NAME.match(name) or ".." in name:
        raise ExportError(
            f"{what} {name!r} cannot be exported: names are letters, digits and _.- "
            "(no '/', no '..', at most 63 characters); rename it and deploy again"
        )
    return name


def declared_tools(
    version: dict[str, Any], compose: str | None, extra: Sequence[str]
) -> list[str] | None:
    """The MCP tools the version declares (x-denv.tools), or None when it declares none.

    The version keeps them (`Version.tools`); for a version from a server older than that
    field, the compose file the project was deployed from (`--compose`) supplies them.
    `--tool` names are added to either.
    """
    found: list[Any] | None = None
    stored = version.get("tools")
    if isinstance(stored, list):
        found = stored
    elif compose is not None:
        try:
            doc = yaml.safe_load(compose)
        except yaml.YAMLError as exc:
            raise ExportError(f"--compose: not valid YAML ({exc})") from exc
        block = doc.get("x-denv") if isinstance(doc, dict) else None
        raw = block.get("tools") if isinstance(block, dict) else None
        if raw is not None and not isinstance(raw, list):
            raise ExportError("--compose: x-denv.tools must be a list of tool names")
        found = raw
    if extra:
        found = [*(found or []), *extra]
    if found is None:
        return None
    names = [t.get("name") if isinstance(t, dict) else t for t in found]
    return list(dict.fromkeys(check_name("tool", str(n) if n is not None else "") for n in names))


def make_plan(
    version: dict[str, Any],
    tools: list[str] | None,
    inspect: Any = None,
    progress: Any = None,
) -> ExportPlan:
    """Check `version` (as the API returns it) and pin its images."""
    inspect = inspect or inspect_image
    vid = version.get("id", "?")
    services = {s.get("name"): s for s in version.get("services") or []}
    agent_name = version.get("agent_service")
    agent = services.get(agent_name)
    if not agent_name or agent is None:
        raise ExportError(
            f"version {vid} has no agent service (x-denv.agent.service names none of its "
            f"services {sorted(str(n) for n in services)}): an export serves the agent "
            "service's OpenEnv server; deploy a compose file with x-denv.agent.service"
        )
    if not agent.get("ports"):
        raise ExportError(
            f"version {vid}: the agent service {agent_name!r} exposes no port, so there is "
            "no OpenEnv server to reach; add its port to the compose file and deploy again"
        )
    for name in services:
        check_name("service", str(name))
    project = version.get("project")
    if project is not None:
        check_name("project", project)
    pins = []
    for svc in services.values():
        if progress is not None:
            progress.step(f"inspecting image {svc['image']} ({_short(svc['image_digest'])})")
        pins.append(inspect(str(svc["name"]), str(svc["image"]), str(svc["image_digest"])))
    agent_pin = next(p for p in pins if p.service == agent_name)
    if agent_pin.kind != "registry digest" and agent_pin.kind != CONTENT:
        agent_pin = pin_content(agent_pin, progress)
        pins = [agent_pin if p.service == agent_name else p for p in pins]
    name = (project or f"denv-{vid[4:].lower()}").replace("-", "_").replace(".", "_") + "_env"
    return ExportPlan(
        version_id=str(vid),
        project=project,
        name=name,
        agent_service=str(agent_name),
        agent_port=int(agent["ports"][0]),
        health_path=str(agent.get("health_path") or "/health"),
        tools=tools,
        agent=agent_pin,
        services=pins,
        version=version,
    )


def _short(image_id: str) -> str:
    return image_id.split(":", 1)[-1][:12]


def inspect_image(service: str, image: str, image_id: str) -> ImagePin:
    """Pin `image_id` by a registry digest when the engine has one, else by the id itself.

    Images built here have no registry digest; `make_plan` pins the agent's by content
    (`pin_content`), since builders other than the legacy one cannot use a bare id in FROM.
    """
    info = _docker_inspect(image_id)
    if info is None:
        return ImagePin(service, image, image_id, image_id, "image id (not on this Docker Engine)")
    repo = image.rsplit("@", 1)[0]
    repo = repo if ":" not in repo.rsplit("/", 1)[-1] else repo.rsplit(":", 1)[0]
    digests: Iterable[str] = info.get("RepoDigests") or []
    ours = [d for d in digests if d.split("@", 1)[0] == repo] or list(digests)
    user = str((info.get("Config") or {}).get("User") or "")
    if ours:
        return ImagePin(service, image, image_id, ours[0], "registry digest", user)
    return ImagePin(service, image, image_id, image_id, "image id", user)


def base_tag(image_id: str) -> str:
    """The tag an export's FROM names: derived from the image id (a digest of its content)."""
    return f"{BASE_REPOSITORY}:{image_id.split(':', 1)[-1]}"


def pin_content(pin: ImagePin, progress: Any = None) -> ImagePin:
    """Pin a local image without a registry digest by a tag and the digest of its files.

    BuildKit (`docker buildx build`, `docker compose build`) reads `FROM sha256:<id>` as an
    image named `sha256` on Docker Hub, so FROM names a tag instead, derived from the id
    and put on the image here. A tag can be moved to any image, so the build also checks
    the base's files against the digest taken now (templates/denv-base-check.py).
    """
    if pin.kind != "image id":
        raise ExportError(
            f"the agent image {pin.image} ({_short(pin.image_id)}) is not on this Docker "
            "Engine, so the export cannot pin its content: run denv export where the image "
            "is (docker load or pull it first)"
        )
    if progress is not None:
        progress.step(f"taking the digest of the files of {pin.image} (the build checks it)")
    digest = _files_digest(pin.image_id)
    tag = base_tag(pin.image_id)
    _docker("tag", pin.image_id, tag)
    return replace(pin, reference=tag, kind=CONTENT, files_digest=digest)


def base_check_script() -> bytes:
    """templates/denv-base-check.py: the files digest, as the export and the build take it."""
    return resources.files(__package__).joinpath("templates", BASE_CHECK).read_bytes()


def _files_digest(image_id: str) -> str:
    # As root (the build checks as root too), with no network, nothing writable and no
    # capability but reading every file: the image's own code runs only its python3.
    done = subprocess.run(
        ["docker", "run", "--rm", "-i", "--network", "none", "--read-only", "--user", "0",
         "--cap-drop", "ALL", "--cap-add", "DAC_READ_SEARCH", "--entrypoint", "python3",
         image_id, "-I", "-B", "-"],
        input=base_check_script(), capture_output=True, check=False, timeout=600,
    )  # fmt: skip
    found = done.stdout.decode(errors="replace").strip()
    if done.returncode != 0 or not re.fullmatch(r"sha256:[0-9a-f]{64}", found):
        raise ExportError(
            f"could not take the digest of the files of image {_short(image_id)} (it needs "
            f"python3 on its PATH, as the exported server does): "
            f"{done.stderr.decode(errors='replace').strip()[-500:]}"
        )
    return found


def _docker(*args: str) -> None:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ExportError(f"docker {' '.join(args)} failed: {done.stderr.strip()}")


def _docker_inspect(image_id: str) -> dict[str, Any] | None:
    if shutil.which("docker") is None:
        return None
    done = subprocess.run(
        ["docker", "image", "inspect", image_id], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return None
    found = json.loads(done.stdout)
    return found[0] if found and isinstance(found[0], dict) else None
