from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

from ..models.wait_request_until import WaitRequestUntil
from ..types import UNSET, Unset

T = TypeVar("T", bound="WaitRequest")


@_attrs_define
class WaitRequest:
    """
    Attributes:
        until (WaitRequestUntil | Unset):  Default: WaitRequestUntil.HEALTHY.
        timeout_s (float | Unset):  Default: 60.0.
    """

    until: WaitRequestUntil | Unset = WaitRequestUntil.HEALTHY
    timeout_s: float | Unset = 60.0

    def to_dict(self) -> dict[str, Any]:
        until: str | Unset = UNSET
        if not isinstance(self.until, Unset):
            until = self.until.value

        timeout_s = self.timeout_s

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if until is not UNSET:
            field_dict["until"] = until
        if timeout_s is not UNSET:
            field_dict["timeout_s"] = timeout_s

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        _until = d.pop("until", UNSET)
        until: WaitRequestUntil | Unset
        if isinstance(_until, Unset):
            until = UNSET
        else:
            until = WaitRequestUntil(_until)

        timeout_s = d.pop("timeout_s", UNSET)

        wait_request = cls(
            until=until,
            timeout_s=timeout_s,
        )

        return wait_request
