from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.egress import Egress
from ..models.live_auto import LiveAuto
from ..models.wait_for import WaitFor
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.egress_allowlist import EgressAllowlist
    from ..models.env_vars import EnvVars
    from ..models.labels import Labels


T = TypeVar("T", bound="SandboxCreate")


@_attrs_define
class SandboxCreate:
    """
    Attributes:
        image (str): An image on the server's engine, by name or id.
        command (list[str] | None | Unset): Overrides the image's command.
        env (EnvVars | Unset): Environment variables for the service; names are letters, digits and `_`, not starting
            with a digit.
        ports (list[int] | Unset): Container ports to expose; the first is the agent port.
        egress (Egress | EgressAllowlist | Unset): `deny` (the default), `allow`, or an allowlist: `{"allow": ["name-or-
            cidr[:port]", ...]}`.
        volumes (list[str] | Unset): Absolute container paths that get a forkable volume, besides `/work`.
        labels (Labels | Unset): Free-form labels (at most 32, keys up to 63 and values up to 255 characters).
        ttl_s (int | Unset): Seconds until the env is deleted by the server: an upper bound,
            whether or not a lease holds it.
             Default: 3600.
        lease_id (None | str | Unset): The lease that holds the new env(s): an open lease of this API key
            (`POST /v1/leases`). When the lease expires or is closed, the
            server deletes every env it holds. Absent or null: the env is
            detached, kept until `ttl_s` or a delete. An expired or closed
            lease is 409 `conflict` (`details.lease_id`, `details.state`); an
            unknown one is 404.
        wait (WaitFor | Unset): When a create returns: `none` at once, `running` once the containers
            run, `healthy` once the agent service answers its health path.
        wait_timeout_s (float | Unset): How long `wait` may take before the env is reported `failed`. Default: 120.0.
        health_path (str | Unset): The HTTP path that answers 200 when the agent service is ready. Default: '/health'.
        pull (bool | Unset): Pull the image when the engine does not have it (otherwise 422 `image_not_found`);
            anonymously unless the server allows its registry credentials (`--pull-credentials`). Default: False.
        warm (int | Unset): Keep this many booted spares of this env's configuration ready, for
            its forks and for later creates of the same image with the same
            settings: with `warm_fork`, such a create takes a ready spare
            (the env's `start` is `warm`) instead of booting.
             Default: 0.
        warm_fork (bool | Unset): Declare that the agent service reads its volumes per session, not
            at boot, so children and later creates of the same image may be
            started from booted spares.
             Default: False.
        live (bool | LiveAuto | Unset): Start the agent service ready for live forks (`kind: live` on
            fork): denv runs the image's own command, unchanged, under a
            launcher it mounts into the container, and takes over where
            uvicorn starts serving, so a fork copies the running server
            process, memory included, in milliseconds. The image is not
            changed. `true` is refused with 409 `live_unsupported` when the
            server cannot be copied (more than one worker, `--reload`, a
            server that is not uvicorn in Python), naming the reason; fork
            with `kind: volume` (or leave `live` off) instead. `auto` starts
            the same way and keeps the env when its server cannot be copied:
            it then serves as without `live` (its `live` is false, and
            `live_unsupported` says why), and its forks boot from a snapshot
            of `/work`. An image with no Python at all is refused with 409
            `live_unsupported` for `auto` too (nothing of it is left): create
            it without `live`.
             Default: False.
        count (int | Unset): Create this many envs of the image at once (at most 32). With
            `count` the answer is an `EnvBatch`: every env in it carries its
            own status, so one that failed (`failed`, with its `error`) leaves
            the others running. Without it the answer is one `Env`.
    """

    image: str
    command: list[str] | None | Unset = UNSET
    env: EnvVars | Unset = UNSET
    ports: list[int] | Unset = UNSET
    egress: Egress | EgressAllowlist | Unset = UNSET
    volumes: list[str] | Unset = UNSET
    labels: Labels | Unset = UNSET
    ttl_s: int | Unset = 3600
    lease_id: None | str | Unset = UNSET
    wait: WaitFor | Unset = UNSET
    wait_timeout_s: float | Unset = 120.0
    health_path: str | Unset = "/health"
    pull: bool | Unset = False
    warm: int | Unset = 0
    warm_fork: bool | Unset = False
    live: bool | LiveAuto | Unset = False
    count: int | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        image = self.image

        command: list[str] | None | Unset
        if isinstance(self.command, Unset):
            command = UNSET
        elif isinstance(self.command, list):
            command = self.command

        else:
            command = self.command

        env: dict[str, Any] | Unset = UNSET
        if not isinstance(self.env, Unset):
            env = self.env.to_dict()

        ports: list[int] | Unset = UNSET
        if not isinstance(self.ports, Unset):
            ports = self.ports

        egress: dict[str, Any] | str | Unset
        if isinstance(self.egress, Unset):
            egress = UNSET
        elif isinstance(self.egress, Egress):
            egress = self.egress.value
        else:
            egress = self.egress.to_dict()

        volumes: list[str] | Unset = UNSET
        if not isinstance(self.volumes, Unset):
            volumes = self.volumes

        labels: dict[str, Any] | Unset = UNSET
        if not isinstance(self.labels, Unset):
            labels = self.labels.to_dict()

        ttl_s = self.ttl_s

        lease_id: None | str | Unset
        if isinstance(self.lease_id, Unset):
            lease_id = UNSET
        else:
            lease_id = self.lease_id

        wait: str | Unset = UNSET
        if not isinstance(self.wait, Unset):
            wait = self.wait.value

        wait_timeout_s = self.wait_timeout_s

        health_path = self.health_path

        pull = self.pull

        warm = self.warm

        warm_fork = self.warm_fork

        live: bool | str | Unset
        if isinstance(self.live, Unset):
            live = UNSET
        elif isinstance(self.live, LiveAuto):
            live = self.live.value
        else:
            live = self.live

        count = self.count

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "image": image,
            }
        )
        if command is not UNSET:
            field_dict["command"] = command
        if env is not UNSET:
            field_dict["env"] = env
        if ports is not UNSET:
            field_dict["ports"] = ports
        if egress is not UNSET:
            field_dict["egress"] = egress
        if volumes is not UNSET:
            field_dict["volumes"] = volumes
        if labels is not UNSET:
            field_dict["labels"] = labels
        if ttl_s is not UNSET:
            field_dict["ttl_s"] = ttl_s
        if lease_id is not UNSET:
            field_dict["lease_id"] = lease_id
        if wait is not UNSET:
            field_dict["wait"] = wait
        if wait_timeout_s is not UNSET:
            field_dict["wait_timeout_s"] = wait_timeout_s
        if health_path is not UNSET:
            field_dict["health_path"] = health_path
        if pull is not UNSET:
            field_dict["pull"] = pull
        if warm is not UNSET:
            field_dict["warm"] = warm
        if warm_fork is not UNSET:
            field_dict["warm_fork"] = warm_fork
        if live is not UNSET:
            field_dict["live"] = live
        if count is not UNSET:
            field_dict["count"] = count

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.egress_allowlist import EgressAllowlist  # noqa: PLC0415
        from ..models.env_vars import EnvVars  # noqa: PLC0415
        from ..models.labels import Labels  # noqa: PLC0415

        d = dict(src_dict)
        image = d.pop("image")

        def _parse_command(data: object) -> list[str] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                command_type_0 = cast(list[str], data)

                return command_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[str] | None | Unset, data)

        command = _parse_command(d.pop("command", UNSET))

        _env = d.pop("env", UNSET)
        env: EnvVars | Unset
        if isinstance(_env, Unset):
            env = UNSET
        else:
            env = EnvVars.from_dict(_env)

        ports = cast(list[int], d.pop("ports", UNSET))

        def _parse_egress(data: object) -> Egress | EgressAllowlist | Unset:
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                componentsschemas_egress_policy_type_0 = Egress(data)

                return componentsschemas_egress_policy_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            if not isinstance(data, dict):
                raise TypeError()
            componentsschemas_egress_policy_type_1 = EgressAllowlist.from_dict(data)

            return componentsschemas_egress_policy_type_1

        egress = _parse_egress(d.pop("egress", UNSET))

        volumes = cast(list[str], d.pop("volumes", UNSET))

        _labels = d.pop("labels", UNSET)
        labels: Labels | Unset
        if isinstance(_labels, Unset):
            labels = UNSET
        else:
            labels = Labels.from_dict(_labels)

        ttl_s = d.pop("ttl_s", UNSET)

        def _parse_lease_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        lease_id = _parse_lease_id(d.pop("lease_id", UNSET))

        _wait = d.pop("wait", UNSET)
        wait: WaitFor | Unset
        if isinstance(_wait, Unset):
            wait = UNSET
        else:
            wait = WaitFor(_wait)

        wait_timeout_s = d.pop("wait_timeout_s", UNSET)

        health_path = d.pop("health_path", UNSET)

        pull = d.pop("pull", UNSET)

        warm = d.pop("warm", UNSET)

        warm_fork = d.pop("warm_fork", UNSET)

        def _parse_live(data: object) -> bool | LiveAuto | Unset:
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                live_type_1 = LiveAuto(data)

                return live_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(bool | LiveAuto | Unset, data)

        live = _parse_live(d.pop("live", UNSET))

        count = d.pop("count", UNSET)

        sandbox_create = cls(
            image=image,
            command=command,
            env=env,
            ports=ports,
            egress=egress,
            volumes=volumes,
            labels=labels,
            ttl_s=ttl_s,
            lease_id=lease_id,
            wait=wait,
            wait_timeout_s=wait_timeout_s,
            health_path=health_path,
            pull=pull,
            warm=warm,
            warm_fork=warm_fork,
            live=live,
            count=count,
        )

        return sandbox_create
