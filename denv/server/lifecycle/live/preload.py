"""A zygote's preload (``zygotes``): before its first copy, the zygote imports what the env of
its configuration that booted before it imported once it served, and is warmed with one
session-less request, so that each copy does not import them in its own first session.
"""

from __future__ import annotations

import logging

from denv.server.lifecycle.context import Context
from denv.server.node.live import LiveError
from denv.server.records import READY, EnvRecord

log = logging.getLogger(__name__)


def preload(ctx: Context, zygote: EnvRecord, first: EnvRecord) -> bool:
    """Import in the zygote what ``first`` (the env of its configuration that booted
    before it, and has served its client since) imported once it served: the modules a
    server imports in its first session, which each copy would otherwise import in its
    own (no session is opened on the zygote); and warm it with one session-less request
    (the launcher's ``warm``), even when ``first`` is gone already. False when the
    zygote now runs a thread of its own (it can no longer be copied); a failure to ask
    is only logged."""
    node = ctx.node
    if zygote.runtime.live is None:
        return True
    rec = ctx.store.get_env(first.id)
    try:
        missing: list[str] = []
        if rec is not None and rec.runtime.live is not None and rec.status in READY:
            learnt = set(node.live_modules(rec.runtime.live))
            missing = sorted(learnt - set(node.live_modules(zygote.runtime.live)))
        out = node.live_preload(zygote.runtime.live, missing)
    except Exception as exc:  # LiveError, or a cluster node's error: no preload
        why = exc.message if isinstance(exc, LiveError) else repr(exc)
        log.info("zygote: preloading %s failed: %s", zygote.id, why)
        return True
    log.info(
        "zygote: %s preloaded %s of %d modules %s served with (%.1f ms), warmed: %s",
        zygote.id,
        out.get("imported", 0),
        len(missing),
        first.id,
        float(out.get("ms", 0.0)),
        out.get("warm"),
    )
    return not out.get("unknown_threads")
