from enum import StrEnum


class ErrorCode(StrEnum):
    CONFLICT = "conflict"
    DISK_LOW = "disk_low"
    DISK_QUOTA_EXCEEDED = "disk_quota_exceeded"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    ENV_NOT_RUNNING = "env_not_running"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    IMAGE_NOT_FOUND = "image_not_found"
    INTERNAL = "internal"
    INVALID_COMPOSE = "invalid_compose"
    INVALID_REQUEST = "invalid_request"
    LIMIT_EXCEEDED = "limit_exceeded"
    NOT_FOUND = "not_found"
    QUOTA_EXCEEDED = "quota_exceeded"
    RATE_LIMITED = "rate_limited"
    UNAUTHORIZED = "unauthorized"
    VERSION_IN_USE = "version_in_use"

    def __str__(self) -> str:
        return str(self.value)
