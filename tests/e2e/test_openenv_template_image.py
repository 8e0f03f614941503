"""End to end: the env OpenEnv's own `openenv init` generates, on denv.

The image denv-openenv-template:latest is that env built by the Dockerfile `openenv init`
writes, unmodified (images/openenv-template.sh, `make image-openenv-template`). Here it runs
through the test server with DenvProvider under OpenEnv's GenericEnvClient: reset, steps,
state, close, nothing left. One env boot (~5 s).
"""

from __future__ import annotations

import pytest
from conftest import LocalDenv, docker_engine
from denv.openenv import DenvProvider
from openenv.core import GenericEnvClient
from provider_helpers import assert_gone, live_env_ids, message, state_of

pytestmark = pytest.mark.e2e

TEMPLATE_IMAGE = "denv-openenv-template:latest"
LABEL = ("suite", "test-openenv-template-image")


def test_generated_env_resets_and_steps_on_denv(denv_server: LocalDenv) -> None:
    docker_engine(TEMPLATE_IMAGE, build="make image-openenv-template").close()
    provider = DenvProvider(denv_server.url, denv_server.key, labels=dict([LABEL]))
    client = GenericEnvClient.from_docker_image(TEMPLATE_IMAGE, provider=provider).sync()
    try:
        reset = client.reset()
        # The template's echo env greets on reset with its title, from the name it was given.
        assert reset.observation["echoed_message"] == "Denv Template environment ready!"
        for i, text in enumerate(["hello", "from denv"], start=1):
            result = client.step(message(text))
            assert result.observation["echoed_message"] == text
            assert result.observation["message_length"] == len(text)
            assert result.reward == pytest.approx(min(len(text) * 0.1, 1.0))
            assert state_of(client)["step_count"] == i
        env_id = provider.env_id
        assert env_id is not None
    finally:
        client.close()
        provider.close()
    assert_gone(denv_server, [env_id])
    assert live_env_ids(denv_server, LABEL) == []
