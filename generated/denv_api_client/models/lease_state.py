from enum import StrEnum


class LeaseState(StrEnum):
    CLOSED = "closed"
    EXPIRED = "expired"
    OPEN = "open"

    def __str__(self) -> str:
        return str(self.value)
