from enum import StrEnum


class EnvServiceStatus(StrEnum):
    CREATED = "created"
    EXITED = "exited"
    MISSING = "missing"
    PAUSED = "paused"
    RUNNING = "running"

    def __str__(self) -> str:
        return str(self.value)
