from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.lease_state import LeaseState

T = TypeVar("T", bound="Lease")


@_attrs_define
class Lease:
    """
    Attributes:
        id (str): A lease's id, `lse_` followed by a ULID.
        state (LeaseState): `open` (renewed in time), `expired` (no renewal for `timeout_s`:
            its envs were deleted) or `closed` (its client closed it: its envs
            were deleted).
        timeout_s (float): Seconds without a renewal before it expires.
        expires_at (datetime.datetime): When it expires unless renewed.
        created_at (datetime.datetime):
        ended_at (datetime.datetime | None): When it expired or was closed; null while open.
        envs (int): Envs it holds that are not deleted.
    """

    id: str
    state: LeaseState
    timeout_s: float
    expires_at: datetime.datetime
    created_at: datetime.datetime
    ended_at: datetime.datetime | None
    envs: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        id = self.id

        state = self.state.value

        timeout_s = self.timeout_s

        expires_at = self.expires_at.isoformat()

        created_at = self.created_at.isoformat()

        ended_at: None | str
        if isinstance(self.ended_at, datetime.datetime):
            ended_at = self.ended_at.isoformat()
        else:
            ended_at = self.ended_at

        envs = self.envs

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "id": id,
                "state": state,
                "timeout_s": timeout_s,
                "expires_at": expires_at,
                "created_at": created_at,
                "ended_at": ended_at,
                "envs": envs,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        id = d.pop("id")

        state = LeaseState(d.pop("state"))

        timeout_s = d.pop("timeout_s")

        expires_at = datetime.datetime.fromisoformat(d.pop("expires_at"))

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        def _parse_ended_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                ended_at_type_0 = datetime.datetime.fromisoformat(data)

                return ended_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        ended_at = _parse_ended_at(d.pop("ended_at"))

        envs = d.pop("envs")

        lease = cls(
            id=id,
            state=state,
            timeout_s=timeout_s,
            expires_at=expires_at,
            created_at=created_at,
            ended_at=ended_at,
            envs=envs,
        )

        lease.additional_properties = d
        return lease

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
