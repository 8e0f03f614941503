from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.endpoint_via import EndpointVia

T = TypeVar("T", bound="Endpoint")


@_attrs_define
class Endpoint:
    """Where a client reaches one of a service's ports.

    Attributes:
        service (str): A service's name, as in a compose file.
        port (int): The container port.
        url (str): The base URL; OpenEnv clients use it as their base URL (WebSocket at `<url>/ws`).
        via (EndpointVia): `ingress`: through the server's proxy (egress deny); `published`: a port on the server's
            host.
    """

    service: str
    port: int
    url: str
    via: EndpointVia
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        service = self.service

        port = self.port

        url = self.url

        via = self.via.value

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "service": service,
                "port": port,
                "url": url,
                "via": via,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        service = d.pop("service")

        port = d.pop("port")

        url = d.pop("url")

        via = EndpointVia(d.pop("via"))

        endpoint = cls(
            service=service,
            port=port,
            url=url,
            via=via,
        )

        endpoint.additional_properties = d
        return endpoint

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
