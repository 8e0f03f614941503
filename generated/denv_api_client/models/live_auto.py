from enum import StrEnum


class LiveAuto(StrEnum):
    AUTO = "auto"

    def __str__(self) -> str:
        return str(self.value)
