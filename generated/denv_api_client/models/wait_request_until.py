from enum import StrEnum


class WaitRequestUntil(StrEnum):
    DELETED = "deleted"
    HEALTHY = "healthy"
    RUNNING = "running"

    def __str__(self) -> str:
        return str(self.value)
