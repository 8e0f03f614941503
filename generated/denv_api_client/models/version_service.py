from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.env_vars import EnvVars


T = TypeVar("T", bound="VersionService")


@_attrs_define
class VersionService:
    """
    Attributes:
        name (str): A service's name, as in a compose file.
        image (str):
        image_digest (str): The image's id (`sha256:...`).
        command (list[str] | None):
        env (EnvVars): Environment variables for the service; names are letters, digits and `_`, not starting with a
            digit.
        ports (list[int]):
        volumes (list[str]): Container paths of the service's forkable volumes.
        depends_on (list[str]):
        health_path (None | str): The HTTP path checked for `healthy` (agent service only).
    """

    name: str
    image: str
    image_digest: str
    command: list[str] | None
    env: EnvVars
    ports: list[int]
    volumes: list[str]
    depends_on: list[str]
    health_path: None | str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        image = self.image

        image_digest = self.image_digest

        command: list[str] | None
        if isinstance(self.command, list):
            command = self.command

        else:
            command = self.command

        env = self.env.to_dict()

        ports = self.ports

        volumes = self.volumes

        depends_on = self.depends_on

        health_path: None | str
        health_path = self.health_path

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "name": name,
                "image": image,
                "image_digest": image_digest,
                "command": command,
                "env": env,
                "ports": ports,
                "volumes": volumes,
                "depends_on": depends_on,
                "health_path": health_path,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.env_vars import EnvVars  # noqa: PLC0415

        d = dict(src_dict)
        name = d.pop("name")

        image = d.pop("image")

        image_digest = d.pop("image_digest")

        def _parse_command(data: object) -> list[str] | None:
            if data is None:
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                command_type_0 = cast(list[str], data)

                return command_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[str] | None, data)

        command = _parse_command(d.pop("command"))

        env = EnvVars.from_dict(d.pop("env"))

        ports = cast(list[int], d.pop("ports"))

        volumes = cast(list[str], d.pop("volumes"))

        depends_on = cast(list[str], d.pop("depends_on"))

        def _parse_health_path(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        health_path = _parse_health_path(d.pop("health_path"))

        version_service = cls(
            name=name,
            image=image,
            image_digest=image_digest,
            command=command,
            env=env,
            ports=ports,
            volumes=volumes,
            depends_on=depends_on,
            health_path=health_path,
        )

        version_service.additional_properties = d
        return version_service

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
