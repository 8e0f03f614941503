from enum import StrEnum


class EnvErrorCode(StrEnum):
    ENGINE_ERROR = "engine_error"
    EXITED = "exited"
    HEALTH_TIMEOUT = "health_timeout"
    LIVE_UNSUPPORTED = "live_unsupported"
    LOST = "lost"
    START_FAILED = "start_failed"

    def __str__(self) -> str:
        return str(self.value)
