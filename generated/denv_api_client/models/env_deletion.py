from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.env_deletion_reason import EnvDeletionReason

T = TypeVar("T", bound="EnvDeletion")


@_attrs_define
class EnvDeletion:
    """Why and when an env was deleted.

    Attributes:
        reason (EnvDeletionReason): `requested` (a `DELETE /v1/envs/{env_id}`), `ttl` (its `ttl_s`
            passed), `lease_expired` (the lease holding it was not renewed in
            time: its client died, was paused, or lost the network),
            `lease_closed` (its client closed the lease, e.g. on exit),
            `server` (the server removed it; `message` says why).
        message (str): The reason in words, naming the lease when there is one.
        at (datetime.datetime):
    """

    reason: EnvDeletionReason
    message: str
    at: datetime.datetime
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        reason = self.reason.value

        message = self.message

        at = self.at.isoformat()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "reason": reason,
                "message": message,
                "at": at,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        reason = EnvDeletionReason(d.pop("reason"))

        message = d.pop("message")

        at = datetime.datetime.fromisoformat(d.pop("at"))

        env_deletion = cls(
            reason=reason,
            message=message,
            at=at,
        )

        env_deletion.additional_properties = d
        return env_deletion

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
