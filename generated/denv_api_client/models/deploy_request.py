from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.labels import Labels


T = TypeVar("T", bound="DeployRequest")


@_attrs_define
class DeployRequest:
    """
    Attributes:
        compose (str): A compose file (YAML) with `x-denv.agent.service`.
        labels (Labels | Unset): Free-form labels (at most 32, keys up to 63 and values up to 255 characters).
    """

    compose: str
    labels: Labels | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        compose = self.compose

        labels: dict[str, Any] | Unset = UNSET
        if not isinstance(self.labels, Unset):
            labels = self.labels.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "compose": compose,
            }
        )
        if labels is not UNSET:
            field_dict["labels"] = labels

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.labels import Labels  # noqa: PLC0415

        d = dict(src_dict)
        compose = d.pop("compose")

        _labels = d.pop("labels", UNSET)
        labels: Labels | Unset
        if isinstance(_labels, Unset):
            labels = UNSET
        else:
            labels = Labels.from_dict(_labels)

        deploy_request = cls(
            compose=compose,
            labels=labels,
        )

        return deploy_request
