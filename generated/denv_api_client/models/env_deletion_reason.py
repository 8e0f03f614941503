from enum import StrEnum


class EnvDeletionReason(StrEnum):
    LEASE_CLOSED = "lease_closed"
    LEASE_EXPIRED = "lease_expired"
    REQUESTED = "requested"
    SERVER = "server"
    TTL = "ttl"

    def __str__(self) -> str:
        return str(self.value)
