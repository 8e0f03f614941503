from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="Project")


@_attrs_define
class Project:
    """
    Attributes:
        name (str): Lower-case letters, digits and dashes.
        latest_version_id (str): A version's id, `ver_` followed by a ULID.
        version_count (int):
        created_at (datetime.datetime):
    """

    name: str
    latest_version_id: str
    version_count: int
    created_at: datetime.datetime
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        latest_version_id = self.latest_version_id

        version_count = self.version_count

        created_at = self.created_at.isoformat()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "name": name,
                "latest_version_id": latest_version_id,
                "version_count": version_count,
                "created_at": created_at,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        name = d.pop("name")

        latest_version_id = d.pop("latest_version_id")

        version_count = d.pop("version_count")

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        project = cls(
            name=name,
            latest_version_id=latest_version_id,
            version_count=version_count,
            created_at=created_at,
        )

        project.additional_properties = d
        return project

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
