from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.health_status import HealthStatus
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.host_guard import HostGuard


T = TypeVar("T", bound="Health")


@_attrs_define
class Health:
    """
    Attributes:
        status (HealthStatus):
        version (str): The server's version.
        engine (str): The container engine's version, or `unavailable`.
        host_guard (HostGuard | Unset): The host guard: the firewall rules of egress, per IP family (iptables and
            ip6tables): the rule that drops new connections from egress-deny envs to the server's host, and the chains that
            keep egress-allow envs off the host, link-local and private networks and allowlist envs on their allowlist. The
            server checks them every few seconds and puts them back when they are missing. While a family is `missing`, deny
            envs may reach the host over it, and creating an env with any other egress is refused (503
            `engine_unavailable`), so IPv6 never lets through what IPv4 refuses.
    """

    status: HealthStatus
    version: str
    engine: str
    host_guard: HostGuard | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        status = self.status.value

        version = self.version

        engine = self.engine

        host_guard: dict[str, Any] | Unset = UNSET
        if not isinstance(self.host_guard, Unset):
            host_guard = self.host_guard.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "status": status,
                "version": version,
                "engine": engine,
            }
        )
        if host_guard is not UNSET:
            field_dict["host_guard"] = host_guard

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.host_guard import HostGuard  # noqa: PLC0415

        d = dict(src_dict)
        status = HealthStatus(d.pop("status"))

        version = d.pop("version")

        engine = d.pop("engine")

        _host_guard = d.pop("host_guard", UNSET)
        host_guard: HostGuard | Unset
        if isinstance(_host_guard, Unset):
            host_guard = UNSET
        else:
            host_guard = HostGuard.from_dict(_host_guard)

        health = cls(
            status=status,
            version=version,
            engine=engine,
            host_guard=host_guard,
        )

        health.additional_properties = d
        return health

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
