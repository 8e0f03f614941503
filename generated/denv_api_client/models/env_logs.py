from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="EnvLogs")


@_attrs_define
class EnvLogs:
    """
    Attributes:
        env_id (str): An env's id, `env_` followed by a ULID.
        service (str): A service's name, as in a compose file.
        lines (list[str]):
    """

    env_id: str
    service: str
    lines: list[str]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        env_id = self.env_id

        service = self.service

        lines = self.lines

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "env_id": env_id,
                "service": service,
                "lines": lines,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        env_id = d.pop("env_id")

        service = d.pop("service")

        lines = cast(list[str], d.pop("lines"))

        env_logs = cls(
            env_id=env_id,
            service=service,
            lines=lines,
        )

        env_logs.additional_properties = d
        return env_logs

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
