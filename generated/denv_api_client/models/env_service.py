from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.env_service_status import EnvServiceStatus
from ..models.start_mode import StartMode
from ..types import UNSET, Unset

T = TypeVar("T", bound="EnvService")


@_attrs_define
class EnvService:
    """
    Attributes:
        name (str): A service's name, as in a compose file.
        image (str): The image as named when the version was made.
        image_digest (str): The image's id (`sha256:...`), which pins it.
        status (EnvServiceStatus):
        start (StartMode | Unset): How the env's agent service was started: `cold` (a boot), `warm` (a
            booted spare took the env's volumes), `live` (a live fork: a copy of
            the parent's running server process, memory included; see
            `POST /v1/envs/{env_id}/fork` with `kind: live`) or `zygote` (a new
            env of a live create, copied from the API key's idle booted server of
            the same image and options, which never served a session: a fresh
            server, fresh entropy, no parent) or `restored` (a child of a fork
            under `--isolation gvisor`: its parent's sandbox was checkpointed and
            this env's sandbox resumed from it, the server's memory as it was;
            see `POST /v1/envs/{env_id}/fork` with `kind: auto`).
    """

    name: str
    image: str
    image_digest: str
    status: EnvServiceStatus
    start: StartMode | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        image = self.image

        image_digest = self.image_digest

        status = self.status.value

        start: str | Unset = UNSET
        if not isinstance(self.start, Unset):
            start = self.start.value

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "name": name,
                "image": image,
                "image_digest": image_digest,
                "status": status,
            }
        )
        if start is not UNSET:
            field_dict["start"] = start

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        name = d.pop("name")

        image = d.pop("image")

        image_digest = d.pop("image_digest")

        status = EnvServiceStatus(d.pop("status"))

        _start = d.pop("start", UNSET)
        start: StartMode | Unset
        if isinstance(_start, Unset):
            start = UNSET
        else:
            start = StartMode(_start)

        env_service = cls(
            name=name,
            image=image,
            image_digest=image_digest,
            status=status,
            start=start,
        )

        env_service.additional_properties = d
        return env_service

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
