from enum import StrEnum


class WaitFor(StrEnum):
    HEALTHY = "healthy"
    NONE = "none"
    RUNNING = "running"

    def __str__(self) -> str:
        return str(self.value)
