from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="EgressAllowlist")


@_attrs_define
class EgressAllowlist:
    """The env reaches only what `allow` lists, and nothing else (IPv6
    included); like `deny`, its ports are served through the ingress proxy
    and it has no resolver. Each entry is `name-or-cidr[:port]`: an IPv4
    address or CIDR (`10.1.2.0/24`), or a host name that the server
    resolves once, when the env is created (its IPv4 addresses then become
    the rules, and the env's `/etc/hosts` maps the name to the first one; a
    fork's children keep their parent's addresses unless the fork gives a
    new allowlist). `host.docker.internal` names the server's host. A port
    limits the entry to that TCP and UDP port; without one every port is
    allowed. The host, private and link-local destinations are refused
    (422) unless the server's operator allows them (the local server's
    `--allow-private-egress`); IPv6 destinations are refused (env networks
    have IPv4 only). A bad entry is 422 `invalid_request` with its
    `details.path`.

        Attributes:
            allow (list[str]):
    """

    allow: list[str]

    def to_dict(self) -> dict[str, Any]:
        allow = self.allow

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "allow": allow,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        allow = cast(list[str], d.pop("allow"))

        egress_allowlist = cls(
            allow=allow,
        )

        return egress_allowlist
