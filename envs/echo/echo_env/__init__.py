"""denv's echo environment: OpenEnv's echo env whose episode survives a fork."""

from .environment import EchoAction, EchoEnvironment, EchoObservation, EchoState

__all__ = ["EchoAction", "EchoEnvironment", "EchoObservation", "EchoState"]
