from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.file_change import FileChange


T = TypeVar("T", bound="VersionDiff")


@_attrs_define
class VersionDiff:
    """
    Attributes:
        base_version_id (str): A version's id, `ver_` followed by a ULID.
        version_id (str): A version's id, `ver_` followed by a ULID.
        changes (list[FileChange]): Files (not directories) that differ, by service and path; at most 10000.
        truncated (bool): More files differ than `changes` holds.
    """

    base_version_id: str
    version_id: str
    changes: list[FileChange]
    truncated: bool
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        base_version_id = self.base_version_id

        version_id = self.version_id

        changes = []
        for changes_item_data in self.changes:
            changes_item = changes_item_data.to_dict()
            changes.append(changes_item)

        truncated = self.truncated

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "base_version_id": base_version_id,
                "version_id": version_id,
                "changes": changes,
                "truncated": truncated,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.file_change import FileChange  # noqa: PLC0415

        d = dict(src_dict)
        base_version_id = d.pop("base_version_id")

        version_id = d.pop("version_id")

        changes = []
        _changes = d.pop("changes")
        for changes_item_data in _changes:
            changes_item = FileChange.from_dict(changes_item_data)

            changes.append(changes_item)

        truncated = d.pop("truncated")

        version_diff = cls(
            base_version_id=base_version_id,
            version_id=version_id,
            changes=changes,
            truncated=truncated,
        )

        version_diff.additional_properties = d
        return version_diff

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
