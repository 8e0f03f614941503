from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.env_error_code import EnvErrorCode
from ..types import UNSET, Unset

T = TypeVar("T", bound="EnvError")


@_attrs_define
class EnvError:
    """Why an env failed.

    Attributes:
        code (EnvErrorCode):
        message (str): What went wrong, for a person. A service killed for passing its
            memory limit says so: `exited` with "... killed, out of memory
            (limit 2048 MiB)".
        log_tail (list[str]): The failed service's last log lines.
        service (None | str | Unset):
    """

    code: EnvErrorCode
    message: str
    log_tail: list[str]
    service: None | str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        code = self.code.value

        message = self.message

        log_tail = self.log_tail

        service: None | str | Unset
        if isinstance(self.service, Unset):
            service = UNSET
        else:
            service = self.service

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "code": code,
                "message": message,
                "log_tail": log_tail,
            }
        )
        if service is not UNSET:
            field_dict["service"] = service

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        code = EnvErrorCode(d.pop("code"))

        message = d.pop("message")

        log_tail = cast(list[str], d.pop("log_tail"))

        def _parse_service(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        service = _parse_service(d.pop("service", UNSET))

        env_error = cls(
            code=code,
            message=message,
            log_tail=log_tail,
            service=service,
        )

        env_error.additional_properties = d
        return env_error

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
