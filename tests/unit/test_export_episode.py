"""The episode record of a Harbor export (runtime/episode.py): sealed by the env service with
the task's DENV_API_KEY, verified by the verifier with the same key; anything else scores 0.

The e2e test (test_export_harbor.py) runs it in real trials; here are the refusals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from denv.openenv.export.runtime.episode import episode_reward, seal, verify

VID = "ver_01JDQ5C8M9W3X7Y2Z4A6B8C0D1"
KEY = "dak_task_key"


def _log(tmp_path: Path, *events: dict[str, Any]) -> Path:
    log = tmp_path / "rewards.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    return log


def test_a_sealed_record_verifies_and_scores_the_steps_after_the_last_reset(
    tmp_path: Path,
) -> None:
    log = _log(
        tmp_path,
        {"event": "reset"},
        {"event": "step", "reward": 5.0},
        {"event": "reset"},
        {"event": "step", "reward": 0.4},
        {"event": "step", "reward": 0.2, "done": True},
    )
    record = json.loads(json.dumps(seal(log, VID, KEY)))  # as written and read back
    assert episode_reward(verify(record, VID, KEY)) == pytest.approx(0.6)


def test_no_log_is_an_empty_episode(tmp_path: Path) -> None:
    record = seal(tmp_path / "absent.jsonl", VID, KEY)
    assert episode_reward(verify(record, VID, KEY)) == 0.0


def test_a_changed_record_or_another_key_or_version_is_refused(tmp_path: Path) -> None:
    record = seal(_log(tmp_path, {"event": "reset"}, {"event": "step", "reward": 1.0}), VID, KEY)
    forged = {**record, "events": [*record["events"], {"event": "step", "reward": 1e6}]}
    with pytest.raises(ValueError, match="does not verify"):
        verify(forged, VID, KEY)
    with pytest.raises(ValueError, match="does not verify"):
        verify(record, VID, "dak_another_key")
    with pytest.raises(ValueError, match="of version"):
        verify(record, "ver_01JDQ5C8M9W3X7Y2Z4A6B8C0D2", KEY)
    for bad in (None, [], {"format": 2}, {**record, "events": "x"}, {**record, "mac": ""}):
        with pytest.raises(ValueError):
            verify(bad, VID, KEY)
