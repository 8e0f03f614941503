from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.file_change_change import FileChangeChange

T = TypeVar("T", bound="FileChange")


@_attrs_define
class FileChange:
    """
    Attributes:
        path (str): The file's path in the container (`/work/...`).
        change (FileChangeChange):
        size (int): Bytes of the file in the newer version (in `base` when deleted).
        service (str): A service's name, as in a compose file.
    """

    path: str
    change: FileChangeChange
    size: int
    service: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        path = self.path

        change = self.change.value

        size = self.size

        service = self.service

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "path": path,
                "change": change,
                "size": size,
                "service": service,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        path = d.pop("path")

        change = FileChangeChange(d.pop("change"))

        size = d.pop("size")

        service = d.pop("service")

        file_change = cls(
            path=path,
            change=change,
            size=size,
            service=service,
        )

        file_change.additional_properties = d
        return file_change

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
