"""What every record of ``denv.types`` shares: ``to_dict`` and the generated-model helpers.

``Record`` gives each frozen dataclass its JSON-ready ``to_dict``; ``opt`` and ``plain_dict``
read the generated models' UNSET and free-form objects, so each record's ``from_api`` stays
one field per line.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from typing import Any

from denv_api_client.types import Unset


def plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


def opt(value: Any) -> Any:
    """The generated models' UNSET (an absent optional field) as None."""
    return None if isinstance(value, Unset) else value


def plain_dict(model: Any) -> dict[str, str]:
    """A generated free-form object (labels, env vars) as a plain dict."""
    return dict(model.additional_properties) if model is not None else {}


class Record:
    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values, field for field (enums as strings, times in ISO)."""
        assert dataclasses.is_dataclass(self)
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
