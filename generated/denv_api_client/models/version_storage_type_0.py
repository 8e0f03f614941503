from enum import StrEnum


class VersionStorageType0(StrEnum):
    DURABLE = "durable"
    LOST = "lost"
    NODE = "node"
    UPLOADING = "uploading"

    def __str__(self) -> str:
        return str(self.value)
