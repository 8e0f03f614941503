"""The flooding key's worker of test_flood, in a module of its own.

It runs in spawned processes, which import the module that holds it; this one imports
nothing of the tests' conftest modules (a spawned process would find another ``conftest``
first on its path: tests/unit's).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx


def flood(
    url: str, key: str, parent: str, create: dict[str, Any], stop: Any, out: Any, clients: int
) -> None:
    """``clients`` threads that each create, fork and delete as fast as the server answers,
    ignoring every refusal; puts what they were answered on ``out``.

    Runs in a process of its own, so the flood does not take this process's GIL from the
    thread that measures the other key."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {key}"}

    def client() -> None:
        mine: Counter[str] = Counter()
        with httpx.Client(base_url=url, headers=headers, timeout=300, trust_env=False) as c:
            while not stop.is_set():
                res = c.post("/v1/sandboxes", json=create)
                mine[f"create {res.status_code}"] += 1
                made = [res.json()["id"]] if res.status_code == 201 else []
                res = c.post(f"/v1/envs/{parent}/fork", json={"count": 2})
                mine[f"fork {res.status_code}"] += 1
                if res.status_code == 201:
                    made += [e["id"] for e in res.json()["envs"]]
                for env_id in made:
                    c.delete(f"/v1/envs/{env_id}")
        with lock:
            seen.update(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(dict(seen))
