"""``Idempotency-Key``: the first response of a create is stored and replayed.

Stored per (caller, key) with a fingerprint of method, path and body; the same key with a
different request gives 409 ``idempotency_conflict``. Only successful (2xx) responses are
stored, so a failed create can be retried with the same key. A stored body holds no ingress
token: they are cut from its URLs and derived again on a replay (``denv.server.tokens``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from denv.server.db import Store
from denv.server.errors import ApiError
from denv.server.tokens import IngressKeys, fill_body, scrub_body

_inflight: set[tuple[str, str]] = set()
_inflight_lock = threading.Lock()


async def idempotent(
    request: Request,
    store: Store,
    owner: str,
    key: str | None,
    run: Callable[[], Awaitable[Any]],
    status: int = 201,
) -> Response:
    """Run ``run`` once per (owner, key); replay its JSON result for a retry."""
    if key is None:
        return JSONResponse(await run(), status_code=status)
    body = await request.body()
    fingerprint = hashlib.sha256(
        request.method.encode() + b" " + request.url.path.encode() + b"\n" + body
    ).hexdigest()
    stored = await asyncio.to_thread(store.get_idempotent, owner, key)
    if stored is not None:
        if stored[0] != fingerprint:
            raise _conflict("was used for a different request")
        replay = json.dumps(fill_body(json.loads(stored[2]), _keys(request)))
        return Response(replay, status_code=stored[1], media_type="application/json")
    with _inflight_lock:
        if (owner, key) in _inflight:
            raise _conflict("is in use by a request still in progress; retry it later")
        _inflight.add((owner, key))
    try:
        result = await run()
        text = json.dumps(result)
        kept = json.dumps(scrub_body(json.loads(text)))
        await asyncio.to_thread(
            store.put_idempotent, owner, key, fingerprint, status, kept, time.time()
        )
        return Response(text, status_code=status, media_type="application/json")
    finally:
        with _inflight_lock:
            _inflight.discard((owner, key))


def _keys(request: Request) -> IngressKeys:
    keys: IngressKeys = request.app.state.service.ctx.ingress_keys
    return keys


def _conflict(why: str) -> ApiError:
    return ApiError(
        409, "idempotency_conflict", f"this Idempotency-Key {why}: use a new key for a new request"
    )
