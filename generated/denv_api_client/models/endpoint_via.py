from enum import StrEnum


class EndpointVia(StrEnum):
    INGRESS = "ingress"
    PUBLISHED = "published"

    def __str__(self) -> str:
        return str(self.value)
