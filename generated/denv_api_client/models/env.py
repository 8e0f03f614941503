from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.egress import Egress
from ..models.env_status import EnvStatus
from ..models.start_mode import StartMode
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.egress_allowlist import EgressAllowlist
    from ..models.endpoint import Endpoint
    from ..models.env_deletion import EnvDeletion
    from ..models.env_error import EnvError
    from ..models.env_service import EnvService
    from ..models.labels import Labels


T = TypeVar("T", bound="Env")


@_attrs_define
class Env:
    """
    Attributes:
        id (str): An env's id, `env_` followed by a ULID.
        status (EnvStatus): Closed for v1 (a new status comes with a new major version).
            `creating` (resources being made), `starting` (containers run, not yet
            healthy), `running` (containers run; no health check was asked for),
            `healthy` (the agent service answers its health path), `failed`
            (see `error`), `deleted`.
        version_id (str): A version's id, `ver_` followed by a ULID.
        parent_id (None | str): The env this one was forked from.
        project (None | str): The project of its version, if any.
        agent_service (str): A service's name, as in a compose file.
        egress (Egress | EgressAllowlist): `deny` (the default), `allow`, or an allowlist: `{"allow": ["name-or-
            cidr[:port]", ...]}`.
        labels (Labels): Free-form labels (at most 32, keys up to 63 and values up to 255 characters).
        services (list[EnvService]):
        endpoints (list[Endpoint]):
        start (StartMode): How the env's agent service was started: `cold` (a boot), `warm` (a
            booted spare took the env's volumes), `live` (a live fork: a copy of
            the parent's running server process, memory included; see
            `POST /v1/envs/{env_id}/fork` with `kind: live`) or `zygote` (a new
            env of a live create, copied from the API key's idle booted server of
            the same image and options, which never served a session: a fresh
            server, fresh entropy, no parent) or `restored` (a child of a fork
            under `--isolation gvisor`: its parent's sandbox was checkpointed and
            this env's sandbox resumed from it, the server's memory as it was;
            see `POST /v1/envs/{env_id}/fork` with `kind: auto`).
        created_at (datetime.datetime):
        expires_at (datetime.datetime):
        error (EnvError | None):
        live (bool | Unset): The env can be forked with `kind: live`: it was created with
            `live: true`, or it is itself a live child. Its live children
            share its container (and so its network namespace and limits);
            see docs/live-forks.md for what separates them.
             Default: False.
        live_unsupported (None | str | Unset): Why the env cannot be forked live, when it was created with
            `live: auto` and its server turned out not to be copyable (for
            example `uvicorn --workers 4`); null otherwise.
        node (None | str | Unset): The node the env runs on: `local` on a server of one machine, the
            node's name on a cluster (`denv serve --cluster`; see
            docs/cluster.md). Null before the env is placed, and from servers
            older than this field.
        spill (None | str | Unset): Set on a child of a fork with `kind: auto` of a live env that was
            started as a volume fork on another node of a cluster, because its
            parent's node had no room for it under the node's cap
            (`--node-max-envs`, `--node-max-memory`): why, naming that node.
            Such a child booted its server on `/work` as the parent's was at
            the fork (its `start` is `cold`), ready to be forked live in turn;
            the fork's other children are live copies. Null on every other env (see
            docs/cluster.md, "Live envs on a cluster").
        lease_id (None | str | Unset): The lease that holds the env (its client's): when the lease expires
            or is closed, the env is deleted. Null: detached, kept until
            `ttl_s` or a delete. Absent from servers older than leases.
        deletion (EnvDeletion | None | Unset): Why and when it was deleted; null while it is not.
    """

    id: str
    status: EnvStatus
    version_id: str
    parent_id: None | str
    project: None | str
    agent_service: str
    egress: Egress | EgressAllowlist
    labels: Labels
    services: list[EnvService]
    endpoints: list[Endpoint]
    start: StartMode
    created_at: datetime.datetime
    expires_at: datetime.datetime
    error: EnvError | None
    live: bool | Unset = False
    live_unsupported: None | str | Unset = UNSET
    node: None | str | Unset = UNSET
    spill: None | str | Unset = UNSET
    lease_id: None | str | Unset = UNSET
    deletion: EnvDeletion | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.env_deletion import EnvDeletion  # noqa: PLC0415
        from ..models.env_error import EnvError  # noqa: PLC0415

        id = self.id

        status = self.status.value

        version_id = self.version_id

        parent_id: None | str
        parent_id = self.parent_id

        project: None | str
        project = self.project

        agent_service = self.agent_service

        egress: dict[str, Any] | str
        if isinstance(self.egress, Egress):
            egress = self.egress.value
        else:
            egress = self.egress.to_dict()

        labels = self.labels.to_dict()

        services = []
        for services_item_data in self.services:
            services_item = services_item_data.to_dict()
            services.append(services_item)

        endpoints = []
        for endpoints_item_data in self.endpoints:
            endpoints_item = endpoints_item_data.to_dict()
            endpoints.append(endpoints_item)

        start = self.start.value

        created_at = self.created_at.isoformat()

        expires_at = self.expires_at.isoformat()

        error: dict[str, Any] | None
        if isinstance(self.error, EnvError):
            error = self.error.to_dict()
        else:
            error = self.error

        live = self.live

        live_unsupported: None | str | Unset
        if isinstance(self.live_unsupported, Unset):
            live_unsupported = UNSET
        else:
            live_unsupported = self.live_unsupported

        node: None | str | Unset
        if isinstance(self.node, Unset):
            node = UNSET
        else:
            node = self.node

        spill: None | str | Unset
        if isinstance(self.spill, Unset):
            spill = UNSET
        else:
            spill = self.spill

        lease_id: None | str | Unset
        if isinstance(self.lease_id, Unset):
            lease_id = UNSET
        else:
            lease_id = self.lease_id

        deletion: dict[str, Any] | None | Unset
        if isinstance(self.deletion, Unset):
            deletion = UNSET
        elif isinstance(self.deletion, EnvDeletion):
            deletion = self.deletion.to_dict()
        else:
            deletion = self.deletion

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "id": id,
                "status": status,
                "version_id": version_id,
                "parent_id": parent_id,
                "project": project,
                "agent_service": agent_service,
                "egress": egress,
                "labels": labels,
                "services": services,
                "endpoints": endpoints,
                "start": start,
                "created_at": created_at,
                "expires_at": expires_at,
                "error": error,
            }
        )
        if live is not UNSET:
            field_dict["live"] = live
        if live_unsupported is not UNSET:
            field_dict["live_unsupported"] = live_unsupported
        if node is not UNSET:
            field_dict["node"] = node
        if spill is not UNSET:
            field_dict["spill"] = spill
        if lease_id is not UNSET:
            field_dict["lease_id"] = lease_id
        if deletion is not UNSET:
            field_dict["deletion"] = deletion

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.egress_allowlist import EgressAllowlist  # noqa: PLC0415
        from ..models.endpoint import Endpoint  # noqa: PLC0415
        from ..models.env_deletion import EnvDeletion  # noqa: PLC0415
        from ..models.env_error import EnvError  # noqa: PLC0415
        from ..models.env_service import EnvService  # noqa: PLC0415
        from ..models.labels import Labels  # noqa: PLC0415

        d = dict(src_dict)
        id = d.pop("id")

        status = EnvStatus(d.pop("status"))

        version_id = d.pop("version_id")

        def _parse_parent_id(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        parent_id = _parse_parent_id(d.pop("parent_id"))

        def _parse_project(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        project = _parse_project(d.pop("project"))

        agent_service = d.pop("agent_service")

        def _parse_egress(data: object) -> Egress | EgressAllowlist:
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

        egress = _parse_egress(d.pop("egress"))

        labels = Labels.from_dict(d.pop("labels"))

        services = []
        _services = d.pop("services")
        for services_item_data in _services:
            services_item = EnvService.from_dict(services_item_data)

            services.append(services_item)

        endpoints = []
        _endpoints = d.pop("endpoints")
        for endpoints_item_data in _endpoints:
            endpoints_item = Endpoint.from_dict(endpoints_item_data)

            endpoints.append(endpoints_item)

        start = StartMode(d.pop("start"))

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        expires_at = datetime.datetime.fromisoformat(d.pop("expires_at"))

        def _parse_error(data: object) -> EnvError | None:
            if data is None:
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                error_type_0 = EnvError.from_dict(data)

                return error_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(EnvError | None, data)

        error = _parse_error(d.pop("error"))

        live = d.pop("live", UNSET)

        def _parse_live_unsupported(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        live_unsupported = _parse_live_unsupported(d.pop("live_unsupported", UNSET))

        def _parse_node(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        node = _parse_node(d.pop("node", UNSET))

        def _parse_spill(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        spill = _parse_spill(d.pop("spill", UNSET))

        def _parse_lease_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        lease_id = _parse_lease_id(d.pop("lease_id", UNSET))

        def _parse_deletion(data: object) -> EnvDeletion | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                deletion_type_0 = EnvDeletion.from_dict(data)

                return deletion_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(EnvDeletion | None | Unset, data)

        deletion = _parse_deletion(d.pop("deletion", UNSET))

        env = cls(
            id=id,
            status=status,
            version_id=version_id,
            parent_id=parent_id,
            project=project,
            agent_service=agent_service,
            egress=egress,
            labels=labels,
            services=services,
            endpoints=endpoints,
            start=start,
            created_at=created_at,
            expires_at=expires_at,
            error=error,
            live=live,
            live_unsupported=live_unsupported,
            node=node,
            spill=spill,
            lease_id=lease_id,
            deletion=deletion,
        )

        env.additional_properties = d
        return env

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
