from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.error_code import ErrorCode
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.error_details_type_0 import ErrorDetailsType0


T = TypeVar("T", bound="Error")


@_attrs_define
class Error:
    """
    Attributes:
        code (ErrorCode): A stable, machine-readable error code. The set is closed for v1: a
            new code comes with a new major version of the API.
        message (str): What went wrong and what to do about it.
        request_id (str): Quote it when reporting a problem.
        details (ErrorDetailsType0 | None | Unset): Where in the request the problem is, for example {"path":
            "services.db.image"}.
    """

    code: ErrorCode
    message: str
    request_id: str
    details: ErrorDetailsType0 | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.error_details_type_0 import ErrorDetailsType0  # noqa: PLC0415

        code = self.code.value

        message = self.message

        request_id = self.request_id

        details: dict[str, Any] | None | Unset
        if isinstance(self.details, Unset):
            details = UNSET
        elif isinstance(self.details, ErrorDetailsType0):
            details = self.details.to_dict()
        else:
            details = self.details

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "code": code,
                "message": message,
                "request_id": request_id,
            }
        )
        if details is not UNSET:
            field_dict["details"] = details

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.error_details_type_0 import ErrorDetailsType0  # noqa: PLC0415

        d = dict(src_dict)
        code = ErrorCode(d.pop("code"))

        message = d.pop("message")

        request_id = d.pop("request_id")

        def _parse_details(data: object) -> ErrorDetailsType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                details_type_0 = ErrorDetailsType0.from_dict(data)

                return details_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(ErrorDetailsType0 | None | Unset, data)

        details = _parse_details(d.pop("details", UNSET))

        error = cls(
            code=code,
            message=message,
            request_id=request_id,
            details=details,
        )

        error.additional_properties = d
        return error

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
