from enum import StrEnum


class StartMode(StrEnum):
    COLD = "cold"
    LIVE = "live"
    RESTORED = "restored"
    WARM = "warm"
    ZYGOTE = "zygote"

    def __str__(self) -> str:
        return str(self.value)
