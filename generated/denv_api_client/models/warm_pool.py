from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.warm_pool_state import WarmPoolState
from ..types import UNSET, Unset

T = TypeVar("T", bound="WarmPool")


@_attrs_define
class WarmPool:
    """
    Attributes:
        env_id (str):
        state (WarmPoolState): `none`, `filling`, `ready` (ready >= target) or `stalled`.
        target (int): Spares the env asked for (0 when none).
        ready (int): Booted spares waiting for a fork.
        booting (int): Spares being booted now.
        failures (int): Spare boots that failed in a row.
        error (None | str | Unset): Why the last spare boot failed, when it did.
    """

    env_id: str
    state: WarmPoolState
    target: int
    ready: int
    booting: int
    failures: int
    error: None | str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        env_id = self.env_id

        state = self.state.value

        target = self.target

        ready = self.ready

        booting = self.booting

        failures = self.failures

        error: None | str | Unset
        if isinstance(self.error, Unset):
            error = UNSET
        else:
            error = self.error

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "env_id": env_id,
                "state": state,
                "target": target,
                "ready": ready,
                "booting": booting,
                "failures": failures,
            }
        )
        if error is not UNSET:
            field_dict["error"] = error

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        env_id = d.pop("env_id")

        state = WarmPoolState(d.pop("state"))

        target = d.pop("target")

        ready = d.pop("ready")

        booting = d.pop("booting")

        failures = d.pop("failures")

        def _parse_error(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        error = _parse_error(d.pop("error", UNSET))

        warm_pool = cls(
            env_id=env_id,
            state=state,
            target=target,
            ready=ready,
            booting=booting,
            failures=failures,
            error=error,
        )

        warm_pool.additional_properties = d
        return warm_pool

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
