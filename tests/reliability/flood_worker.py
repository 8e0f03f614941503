"""The flooding key's worker of test_flood, in a module of its own.

It runs in spawned processes, which import the module that holds it; this one imports
nothing of the tests' conftest modules (a spawned process would find another ``conftest``
first on its path: tests/unit's).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx


def flood(url: str, key: str, parent: str, create: dict[str, Any], stop: Any, out: Any) -> None:
    """Create, fork and delete as fast as the server answers, ignoring every refusal.

    Runs in a process of its own, so the flood does not take this process's GIL from the
    thread that measures the other key."""
    seen: Counter[str] = Counter()
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=300, trust_env=False) as c:
        while not stop.is_set():
            res = c.post("/v1/sandboxes", json=create)
            seen[f"create {res.status_code}"] += 1
            made = [res.json()["id"]] if res.status_code == 201 else []
            res = c.post(f"/v1/envs/{parent}/fork", json={"count": 2})
            seen[f"fork {res.status_code}"] += 1
            if res.status_code == 201:
                made += [e["id"] for e in res.json()["envs"]]
            for env_id in made:
                c.delete(f"/v1/envs/{env_id}")
    out.put(dict(seen))
