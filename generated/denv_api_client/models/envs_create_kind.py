from enum import StrEnum


class EnvsCreateKind(StrEnum):
    AUTO = "auto"
    LIVE = "live"
    VOLUME = "volume"

    def __str__(self) -> str:
        return str(self.value)
