from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="LeaseCreate")


@_attrs_define
class LeaseCreate:
    """
    Attributes:
        timeout_s (float | Unset): Seconds without a renewal after which the lease expires and its
            envs are deleted (the local server's `--lease-timeout`, 15 by
            default). Renew about every third of it.
    """

    timeout_s: float | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        timeout_s = self.timeout_s

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if timeout_s is not UNSET:
            field_dict["timeout_s"] = timeout_s

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        timeout_s = d.pop("timeout_s", UNSET)

        lease_create = cls(
            timeout_s=timeout_s,
        )

        return lease_create
