from enum import StrEnum


class HostGuardState(StrEnum):
    MISSING = "missing"
    OK = "ok"
    RESTORED = "restored"

    def __str__(self) -> str:
        return str(self.value)
