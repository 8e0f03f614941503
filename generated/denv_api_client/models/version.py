from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.version_storage_type_0 import VersionStorageType0
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.labels import Labels
    from ..models.version_service import VersionService


T = TypeVar("T", bound="Version")


@_attrs_define
class Version:
    """
    Attributes:
        id (str): A version's id, `ver_` followed by a ULID.
        project (None | str):
        parent_env_id (None | str): The env this version was snapshotted from.
        parent_version_id (None | str): The version its parent env ran when it was snapshotted: with
            `Env.version_id` and `parent_env_id`, the chain from any env or
            version to its root (a sandbox's implicit version or a deployed
            one, whose parents are null).
        agent_service (str): A service's name, as in a compose file.
        services (list[VersionService]):
        layer_depth (int): The deepest layer stack among its volumes.
        warm_fork (bool): Whether children may start from booted spares.
        labels (Labels): Free-form labels (at most 32, keys up to 63 and values up to 255 characters).
        created_at (datetime.datetime):
        tools (list[str] | None | Unset): The MCP tools the version declares: its compose file's
            `x-denv.tools` (names), kept by the versions snapshotted from
            it. `denv export` exposes exactly these. Null when none were
            declared (a sandbox's version, or a compose file without the
            key); absent from servers older than this field.
        storage (None | Unset | VersionStorageType0): Where the version's /work layers are kept. `node`: only on the
            node that made them (a server without object storage);
            `uploading`: on that node, being copied to object storage;
            `durable`: every layer is in object storage, so the version
            forks on any node even after its own node is gone; `lost`: its
            node was lost before the upload finished, and forks of it fail.
            Null from servers older than this field.
        size_bytes (int | Unset): Bytes of disk its layers add to its parent version's (all of its
            layers for a root): what it costs the key's disk quota, shared
            with any version made from it. 0 from servers older than this
            field, for versions they made.
        implicit (bool | Unset): Made by a sandbox or a fork rather than asked for: deleted once no
            env and no child version needs it, after the server's grace
            period (`--version-grace`). Snapshots and deployed versions are
            kept until deleted. Absent from servers older than this field.
    """

    id: str
    project: None | str
    parent_env_id: None | str
    parent_version_id: None | str
    agent_service: str
    services: list[VersionService]
    layer_depth: int
    warm_fork: bool
    labels: Labels
    created_at: datetime.datetime
    tools: list[str] | None | Unset = UNSET
    storage: None | Unset | VersionStorageType0 = UNSET
    size_bytes: int | Unset = UNSET
    implicit: bool | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        id = self.id

        project: None | str
        project = self.project

        parent_env_id: None | str
        parent_env_id = self.parent_env_id

        parent_version_id: None | str
        parent_version_id = self.parent_version_id

        agent_service = self.agent_service

        services = []
        for services_item_data in self.services:
            services_item = services_item_data.to_dict()
            services.append(services_item)

        layer_depth = self.layer_depth

        warm_fork = self.warm_fork

        labels = self.labels.to_dict()

        created_at = self.created_at.isoformat()

        tools: list[str] | None | Unset
        if isinstance(self.tools, Unset):
            tools = UNSET
        elif isinstance(self.tools, list):
            tools = self.tools

        else:
            tools = self.tools

        storage: None | str | Unset
        if isinstance(self.storage, Unset):
            storage = UNSET
        elif isinstance(self.storage, VersionStorageType0):
            storage = self.storage.value
        else:
            storage = self.storage

        size_bytes = self.size_bytes

        implicit = self.implicit

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "id": id,
                "project": project,
                "parent_env_id": parent_env_id,
                "parent_version_id": parent_version_id,
                "agent_service": agent_service,
                "services": services,
                "layer_depth": layer_depth,
                "warm_fork": warm_fork,
                "labels": labels,
                "created_at": created_at,
            }
        )
        if tools is not UNSET:
            field_dict["tools"] = tools
        if storage is not UNSET:
            field_dict["storage"] = storage
        if size_bytes is not UNSET:
            field_dict["size_bytes"] = size_bytes
        if implicit is not UNSET:
            field_dict["implicit"] = implicit

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.labels import Labels  # noqa: PLC0415
        from ..models.version_service import VersionService  # noqa: PLC0415

        d = dict(src_dict)
        id = d.pop("id")

        def _parse_project(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        project = _parse_project(d.pop("project"))

        def _parse_parent_env_id(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        parent_env_id = _parse_parent_env_id(d.pop("parent_env_id"))

        def _parse_parent_version_id(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        parent_version_id = _parse_parent_version_id(d.pop("parent_version_id"))

        agent_service = d.pop("agent_service")

        services = []
        _services = d.pop("services")
        for services_item_data in _services:
            services_item = VersionService.from_dict(services_item_data)

            services.append(services_item)

        layer_depth = d.pop("layer_depth")

        warm_fork = d.pop("warm_fork")

        labels = Labels.from_dict(d.pop("labels"))

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        def _parse_tools(data: object) -> list[str] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                tools_type_0 = cast(list[str], data)

                return tools_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[str] | None | Unset, data)

        tools = _parse_tools(d.pop("tools", UNSET))

        def _parse_storage(data: object) -> None | Unset | VersionStorageType0:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                storage_type_0 = VersionStorageType0(data)

                return storage_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | Unset | VersionStorageType0, data)

        storage = _parse_storage(d.pop("storage", UNSET))

        size_bytes = d.pop("size_bytes", UNSET)

        implicit = d.pop("implicit", UNSET)

        version = cls(
            id=id,
            project=project,
            parent_env_id=parent_env_id,
            parent_version_id=parent_version_id,
            agent_service=agent_service,
            services=services,
            layer_depth=layer_depth,
            warm_fork=warm_fork,
            labels=labels,
            created_at=created_at,
            tools=tools,
            storage=storage,
            size_bytes=size_bytes,
            implicit=implicit,
        )

        version.additional_properties = d
        return version

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
