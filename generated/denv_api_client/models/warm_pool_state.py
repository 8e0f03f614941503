from enum import StrEnum


class WarmPoolState(StrEnum):
    FILLING = "filling"
    NONE = "none"
    READY = "ready"
    STALLED = "stalled"

    def __str__(self) -> str:
        return str(self.value)
