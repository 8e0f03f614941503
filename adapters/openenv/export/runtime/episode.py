"""The episode record a Harbor export's verifier scores, sealed with the task's credentials.

The exported server appends every reset and every step's reward, as the env answered it,
to its reward log (DENV_EXPORT_REWARD_LOG). In a Harbor task that server runs in a service
of its own (`env`), apart from the agent's container, and holds DENV_API_KEY, which the
agent never sees. After the agent's phase, Harbor runs

    python -m server.episode seal LOG OUT

in that service: OUT gets the events and an HMAC-SHA256 over them keyed by DENV_API_KEY.
The verifier, in an environment of its own that has the same key, recomputes the HMAC and
scores nothing it cannot verify, so a record the agent wrote or changed scores 0.
Standard library only: it also runs in the verifier's image.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
from pathlib import Path
from typing import Any

KEY_VAR = "DENV_API_KEY"
#: Separates this use of the key from any other MAC made with it.
_PURPOSE = b"denv-export episode record v1\n"


def _mac(key: str, events: list[dict[str, Any]], version_id: str) -> str:
    body = json.dumps({"version_id": version_id, "events": events}, sort_keys=True)
    return hmac.new(key.encode(), _PURPOSE + body.encode(), hashlib.sha256).hexdigest()


def read_log(log: Path) -> list[dict[str, Any]]:
    """The events of a reward log (none when the server never wrote one)."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def seal(log: Path, version_id: str, key: str) -> dict[str, Any]:
    events = read_log(log)
    return {
        "format": 1,
        "version_id": version_id,
        "events": events,
        "mac": _mac(key, events, version_id),
    }


def verify(record: Any, version_id: str, key: str) -> list[dict[str, Any]]:
    """The record's events, or ValueError when the record is not one the server sealed."""
    if not isinstance(record, dict) or record.get("format") != 1:
        raise ValueError("not an episode record (format 1)")
    events = record.get("events")
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ValueError("the record has no list of events")
    if record.get("version_id") != version_id:
        raise ValueError(f"the record is of version {record.get('version_id')!r}")
    expected = _mac(key, events, version_id)
    if not hmac.compare_digest(expected, str(record.get("mac", ""))):
        raise ValueError("its seal does not verify with the task's key: not written by the env")
    return events


def episode_reward(events: list[dict[str, Any]]) -> float:
    """The sum of the step rewards after the last reset (0 without an episode)."""
    total = 0.0
    for event in events:
        if event.get("event") == "reset":
            total = 0.0
        elif event.get("event") == "step":
            total += float(event.get("reward") or 0.0)
    return total


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[1] != "seal":
        print("usage: python -m server.episode seal LOG OUT", file=sys.stderr)
        return 2
    key = os.environ.get(KEY_VAR, "")
    if not key:
        print(f"{KEY_VAR} is not set: the record cannot be sealed", file=sys.stderr)
        return 1
    version_file = Path(__file__).resolve().parent.parent / "denv-version.json"
    version_id = str(json.loads(version_file.read_text())["version_id"])
    record = seal(Path(argv[2]), version_id, key)
    out = Path(argv[3])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record))
    print(f"sealed {len(record['events'])} events into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
