"""What a node could not do: the node side's one error tree, by how the caller recovers.

Everything below the seam (``docker``, ``node.cluster``, a cluster's node agents) raises
these, and none of them knows HTTP: the API's edge (``denv.server.errors``) gives each
``Refused`` its status, and the lifecycle turns the rest into an env's error or a
decision (place elsewhere, boot instead of copying). Each carries a stable machine
``code``, a ``message`` that names the fix, and optional ``details`` (plain values), and
keeps all its fields across a trip to another process (pickle, as Ray sends it)::

    NodeError                 code, message, details
      Refused                 the node says no to this call; the API answers it as it is
        Invalid               invalid_request: the request is wrong (a bad egress policy)
        ImageNotFound         image_not_found: build, load or pull the image
        Unavailable           engine_unavailable: retry later, or on another node
          EngineUnavailable   its Docker Engine does not answer
          NoCapacity          it has no room for another env network (subnets)
      BootFailed              the env cannot boot: its code and message become its error
      Cancelled               the boot was cancelled (env deleted, pool dropped, stopping)
      NodeLost                node_lost: the node does not answer at all
      LiveError               a live fork could not be made (code: busy, fork_unsafe ...)

    try:
        node.inspect_image("my-env:1", pull=False)
    except ImageNotFound as exc:
        exc.code, exc.details     # "image_not_found", {"image": "my-env:1"}
"""

from __future__ import annotations

import copy
from typing import Any, Self


class NodeError(Exception):
    """Something a node could not do: ``code`` (stable, for machines), ``message`` (for
    people: what went wrong and what to do) and ``details`` (plain values, or None)."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Every field survives a trip to another process, whatever a subclass's __init__ takes.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))

    def reworded(self, message: str, details: dict[str, Any] | None = None) -> Self:
        """The same error, of the same class, saying ``message`` (e.g. naming the node it
        happened on); ``details`` replace its details when given."""
        err = copy.copy(self)
        err.args, err.message = (message,), message
        if details is not None:
            err.details = details
        return err


def _rebuild(cls: type[NodeError], args: tuple[Any, ...], state: dict[str, Any]) -> NodeError:
    err = cls.__new__(cls, *args)  # its args, without its __init__
    err.__dict__.update(state)
    return err


class Refused(NodeError):
    """The node says no to this call, and the message says why: the API answers it as it
    is (with the status the edge gives its kind)."""


class Invalid(Refused):
    """The request is wrong (e.g. an egress entry that is not a destination); ``path``
    names the request's field."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__("invalid_request", message, {"path": path} if path else None)


class ImageNotFound(Refused):
    """The image is not on the node (nor on any node asked, ``nodes``): build, load or
    pull it."""

    def __init__(self, message: str, image: str, nodes: list[str] | None = None) -> None:
        details: dict[str, Any] = {"image": image}
        if nodes is not None:
            details["nodes"] = nodes
        super().__init__("image_not_found", message, details)


class Unavailable(Refused):
    """The node cannot serve this now: retry later, or on another node."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__("engine_unavailable", message, details)


class EngineUnavailable(Unavailable):
    """The node's engine (the Docker Engine) does not answer."""


class NoCapacity(Unavailable):
    """The node has no room for another env network: every subnet of its pool is in use."""


class CheckpointUnsupported(Refused):
    """The node cannot save this env's sandbox (no sandbox under runc, a runtime too old, a
    state the runtime cannot save); forks boot from a snapshot of ``/work`` instead. Were it
    ever answered, a conflict with the env's state (409 ``conflict``)."""

    def __init__(self, message: str) -> None:
        super().__init__("conflict", message)


class BootFailed(NodeError):
    """The env cannot boot; ``code`` and ``message`` become its ``error``. What the boot had
    made by then (``network``, ``containers``) is named for the env's teardown."""

    def __init__(
        self,
        code: str,
        message: str,
        service: str | None = None,
        network: str | None = None,
        containers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(code, message)
        self.service, self.network, self.containers = service, network, dict(containers or {})


class Cancelled(NodeError):
    """The boot was cancelled (its env deleted, its pool dropped, the node stopping)."""

    def __init__(self, message: str = "the boot was cancelled") -> None:
        super().__init__("cancelled", message)


class NodeLost(NodeError):
    """The node does not answer: its machine (or its agent) is gone or unreachable."""

    def __init__(self, node: str, reason: str = "") -> None:
        super().__init__("node_lost", f"node {node} is lost" + (f": {reason}" if reason else ""))
        self.node, self.reason = node, reason


class LiveError(NodeError):
    """A live fork could not be made; ``code`` says why (``busy``, ``fork_unsafe``,
    ``live_unsupported``, ``node_full`` ...), and the lifecycle gives it its status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
