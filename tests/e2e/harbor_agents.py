"""Small scripted Harbor agents for the exported task's trials (test_export_harbor.py).

Harbor imports this module (`harbor trial start -a harbor_agents:EpisodeAgent`, with this
folder on PYTHONPATH), in its own Python 3.12 venv: it is not a test module.

- `EpisodeAgent` plays one episode in the agent's sandbox over an OpenEnv client: reset,
  the state after it, then steps whose messages come from DENV_TEST_MESSAGES (echo's
  reward is a tenth of the message's length); what it saw goes to the agent log dir.
- `ForgingAgent` plays nothing and tries every way it has to fake a score: it appends
  rewards to a reward log in its sandbox and writes a forged, unsealed episode record
  where Harbor collects artifacts.
"""

from __future__ import annotations

import json
import os
import shlex

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

PLAY = """
import json, os, sys
from openenv.core import GenericEnvClient
messages = json.loads(sys.argv[1])
with GenericEnvClient(base_url=os.environ["DENV_EXPORT_URL"], message_timeout_s=300).sync() as env:
    env.reset()
    state = dict(env.state())
    rewards = [env.step({"message": m}).reward for m in messages]
print(json.dumps({"state": state, "rewards": rewards, "uid": os.getuid()}))
"""

FORGE = """
set -u
id -u
mkdir -p /var/lib/denv-export /logs/artifacts/denv 2>/dev/null
echo '{"event": "step", "reward": 1000000}' >> /var/lib/denv-export/rewards.jsonl
fake='{"event": "step", "reward": 1000000}'
printf '{"format": 1, "version_id": "%s", "events": [%s], "mac": "00"}' \
  "$DENV_TEST_VERSION" "$fake" > /logs/artifacts/denv/episode.json
echo forged
"""


class EpisodeAgent(BaseAgent):
    @staticmethod
    def name() -> str:
        return "denv-test-episode"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        messages = os.environ.get("DENV_TEST_MESSAGES", '["abcd"]')
        command = f"/opt/denv-export/python -c {shlex.quote(PLAY)} {shlex.quote(messages)}"
        done = await environment.exec(command, timeout_sec=600)
        (self.logs_dir / "episode.json").write_text(
            json.dumps({"rc": done.return_code, "stdout": done.stdout, "stderr": done.stderr})
        )


class ForgingAgent(BaseAgent):
    @staticmethod
    def name() -> str:
        return "denv-test-forger"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        version = os.environ.get("DENV_TEST_VERSION", "")
        done = await environment.exec(
            f"DENV_TEST_VERSION={shlex.quote(version)} sh -c {shlex.quote(FORGE)}"
        )
        (self.logs_dir / "forge.json").write_text(
            json.dumps({"rc": done.return_code, "stdout": done.stdout, "stderr": done.stderr})
        )
