from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.env import Env
    from ..models.version import Version


T = TypeVar("T", bound="Fork")


@_attrs_define
class Fork:
    """
    Attributes:
        version (Version):
        envs (list[Env]):
    """

    version: Version
    envs: list[Env]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        version = self.version.to_dict()

        envs = []
        for envs_item_data in self.envs:
            envs_item = envs_item_data.to_dict()
            envs.append(envs_item)

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "version": version,
                "envs": envs,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.env import Env  # noqa: PLC0415
        from ..models.version import Version  # noqa: PLC0415

        d = dict(src_dict)
        version = Version.from_dict(d.pop("version"))

        envs = []
        _envs = d.pop("envs")
        for envs_item_data in _envs:
            envs_item = Env.from_dict(envs_item_data)

            envs.append(envs_item)

        fork = cls(
            version=version,
            envs=envs,
        )

        fork.additional_properties = d
        return fork

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
