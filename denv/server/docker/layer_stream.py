"""A packed layer streamed from one node to another over a TCP connection of its own.

The offering node opens a port on its own address (:func:`offer`), for one taker: the first
connection that sends the offer's random token within ``TOKEN_WAIT_S`` gets the file's bytes
(``sendfile``: the kernel copies them, they never enter this process) and the port closes;
a connection without the token is dropped, and an offer nobody took in ``OFFER_TIMEOUT_S``
is withdrawn. The token travels to the taker inside the ``LayerOffer`` (over Ray on a
cluster, which only the cluster's token holders reach). The taker (:func:`receive`) reads
the bytes ``BUF_BYTES`` at a time into a file, hashed on the way: both sides hold buffers
(the taker ``QUEUED`` of them at most), never the layer, whatever its size. The bytes are
not encrypted, like Ray's own traffic; their digest is checked by the taker before the
layer is used.

A stream that fails (no connection, a reset, silence for ``IO_TIMEOUT_S``, fewer bytes than
offered) raises ``NodeLost`` naming the offering node, so a cluster tries another holder or
the object store.
"""

from __future__ import annotations

import hmac
import logging
import queue
import secrets
import socket
import threading
import time
from typing import Any, BinaryIO, Protocol

from denv.server.node.seam import LayerOffer, NodeLost

log = logging.getLogger(__name__)

TOKEN_BYTES = 32
OFFER_TIMEOUT_S = 60.0  # an offer nobody took is withdrawn (its port closed)
TOKEN_WAIT_S = 5.0  # a connection must show the token within this, else it is dropped
CONNECT_TIMEOUT_S = 10.0
IO_TIMEOUT_S = 60.0  # no byte moving for this long ends a transfer
BUF_BYTES = 1 << 20  # what the taker reads at once
QUEUED = 8  # pieces received but not yet hashed and written: at most 8 MiB held


class Sink(Protocol):
    def write(self, data: bytes | memoryview, /) -> int: ...


def offer(packed: BinaryIO, host: str) -> tuple[int, str]:
    """Serve the open file ``packed`` (closed when done) to one taker on ``host``: the port
    and the token (hex) the taker must send."""
    token = secrets.token_bytes(TOKEN_BYTES)
    try:
        listener = socket.create_server((host, 0))
    except BaseException:
        packed.close()
        raise
    port = int(listener.getsockname()[1])
    deadline = time.monotonic() + OFFER_TIMEOUT_S
    threading.Thread(
        target=_serve,
        args=(listener, packed, token, deadline),
        name=f"denv-layer-offer-{port}",
        daemon=True,
    ).start()
    return port, token.hex()


def _serve(listener: socket.socket, packed: BinaryIO, token: bytes, deadline: float) -> None:
    where = f"{packed.name} on port {listener.getsockname()[1]}"
    with listener, packed:
        while (left := deadline - time.monotonic()) > 0:
            listener.settimeout(left)
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                break
            with conn:
                conn.settimeout(TOKEN_WAIT_S)
                try:
                    shown = _recv_exactly(conn, TOKEN_BYTES)
                except OSError:
                    shown = b""
                if not hmac.compare_digest(shown, token):
                    log.warning("layer offer %s: %s showed no valid token: dropped", where, peer)
                    continue
                conn.settimeout(IO_TIMEOUT_S)
                try:
                    conn.sendfile(packed)
                except OSError as exc:  # the taker sees the stream end short, and says so
                    log.warning("layer offer %s: sending to %s failed: %s", where, peer, exc)
                return
        log.warning("layer offer %s: not taken within %.0f s: withdrawn", where, OFFER_TIMEOUT_S)


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        more = conn.recv(n - len(got))
        if not more:
            break
        got += more
    return got


def receive(taken: LayerOffer, out: Sink, origin: str) -> None:
    """Read the offered layer's ``size`` bytes into ``out``; NodeLost naming ``origin`` when
    the stream cannot be opened or breaks off. A thread of its own receives while this one
    hashes and writes, at most ``QUEUED`` pieces of ``BUF_BYTES`` apart."""
    pieces: queue.Queue[memoryview | None] = queue.Queue(QUEUED)
    stop = threading.Event()
    got: dict[str, Any] = {"done": 0, "error": None}

    def put(piece: memoryview | None) -> None:
        while not stop.is_set():
            try:
                pieces.put(piece, timeout=1.0)
                return
            except queue.Full:
                continue

    def read() -> None:
        host, _, port = taken.address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S) as c:
                c.settimeout(IO_TIMEOUT_S)
                c.sendall(bytes.fromhex(taken.token))
                while got["done"] < taken.size and not stop.is_set():
                    piece = bytearray(min(BUF_BYTES, taken.size - got["done"]))
                    n = c.recv_into(piece)
                    if n == 0:
                        break
                    put(memoryview(piece)[:n])
                    got["done"] += n
        except (OSError, ValueError) as exc:  # ValueError: a token that is no hex
            got["error"] = exc
        finally:
            put(None)

    threading.Thread(target=read, name="denv-layer-receive", daemon=True).start()
    try:
        while (piece := pieces.get()) is not None:
            out.write(piece)
    finally:
        stop.set()  # a failed write: the receiving thread ends within a second or a timeout
    done, error = got["done"], got["error"]
    if error is not None:
        raise NodeLost(
            origin, f"streaming its layer from {taken.address} failed after {done} bytes: {error}"
        ) from error
    if done < taken.size:
        raise NodeLost(
            origin,
            f"its layer stream from {taken.address} ended after {done} of {taken.size} bytes",
        )
