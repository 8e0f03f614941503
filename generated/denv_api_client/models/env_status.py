from enum import StrEnum


class EnvStatus(StrEnum):
    CREATING = "creating"
    DELETED = "deleted"
    FAILED = "failed"
    HEALTHY = "healthy"
    RUNNING = "running"
    STARTING = "starting"

    def __str__(self) -> str:
        return str(self.value)
