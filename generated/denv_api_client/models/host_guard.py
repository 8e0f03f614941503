from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.host_guard_state import HostGuardState

T = TypeVar("T", bound="HostGuard")


@_attrs_define
class HostGuard:
    """The host guard: the firewall rules of egress, per IP family (iptables and ip6tables): the rule that drops new
    connections from egress-deny envs to the server's host, and the chains that keep egress-allow envs off the host,
    link-local and private networks and allowlist envs on their allowlist. The server checks them every few seconds and
    puts them back when they are missing. While a family is `missing`, deny envs may reach the host over it, and
    creating an env with any other egress is refused (503 `engine_unavailable`), so IPv6 never lets through what IPv4
    refuses.

        Attributes:
            ipv4 (HostGuardState): `ok`: the rule was in place at the last check; `restored`: it was missing (a firewall
                reload removes it) and the server put it back; `missing`: it is not in place and could not be put back (see
                `reason`).
            ipv6 (HostGuardState): `ok`: the rule was in place at the last check; `restored`: it was missing (a firewall
                reload removes it) and the server put it back; `missing`: it is not in place and could not be put back (see
                `reason`).
            restores (int): How often a missing rule was put back since the server started.
            last_restored_at (datetime.datetime | None): When a missing rule was last put back.
            reason (None | str): Why a family is `missing` (e.g. ip6tables failed), else null.
    """

    ipv4: HostGuardState
    ipv6: HostGuardState
    restores: int
    last_restored_at: datetime.datetime | None
    reason: None | str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        ipv4 = self.ipv4.value

        ipv6 = self.ipv6.value

        restores = self.restores

        last_restored_at: None | str
        if isinstance(self.last_restored_at, datetime.datetime):
            last_restored_at = self.last_restored_at.isoformat()
        else:
            last_restored_at = self.last_restored_at

        reason: None | str
        reason = self.reason

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "ipv4": ipv4,
                "ipv6": ipv6,
                "restores": restores,
                "last_restored_at": last_restored_at,
                "reason": reason,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        ipv4 = HostGuardState(d.pop("ipv4"))

        ipv6 = HostGuardState(d.pop("ipv6"))

        restores = d.pop("restores")

        def _parse_last_restored_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                last_restored_at_type_0 = datetime.datetime.fromisoformat(data)

                return last_restored_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        last_restored_at = _parse_last_restored_at(d.pop("last_restored_at"))

        def _parse_reason(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        reason = _parse_reason(d.pop("reason"))

        host_guard = cls(
            ipv4=ipv4,
            ipv6=ipv6,
            restores=restores,
            last_restored_at=last_restored_at,
            reason=reason,
        )

        host_guard.additional_properties = d
        return host_guard

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
