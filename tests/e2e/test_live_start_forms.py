"""End to end: live forks of the echo env however its image starts the server.

OpenEnv's echo env as OpenEnv's own Dockerfile builds it (the env `openenv init` generates),
and one image per start form of OpenEnv's own Dockerfiles (envs/*/server/Dockerfile in
huggingface/OpenEnv: `sh -c "cd /app/env && uvicorn ..."` with PYTHONPATH set by the image,
shell-form `python -m uvicorn ... --port ${PORT:-8000}`, a start script, gunicorn with one
UvicornWorker, ENTRYPOINT plus CMD), each built FROM the echo image with nothing changed but
how it starts. Each runs live through DenvProvider with no option set (`fork="auto"`, the
default), and a fork(2) of it continues the root's episode. A server that cannot be copied is
refused with a 409 naming the reason when live is asked for (`live=True`), and leaves nothing
behind; with the default it serves as it would without denv's launcher, says why it is not
live, and forks from a volume snapshot. An image without Python is refused for `auto` too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import LocalDenv
from denv.openenv import DenvProvider, fork_clients
from openenv.core import GenericEnvClient
from provider_helpers import (
    ECHO_IMAGE,
    TEST_TAG,
    assert_gone,
    delete_all,
    derived_images,
    message,
    state_of,
)

from denv import Conflict, Denv

pytestmark = pytest.mark.e2e

APP = "echo_env.app:app"
START_SH = f"""#!/bin/sh
set -e
echo "starting the echo env"
cd /app
uvicorn {APP} --host 0.0.0.0 --port "${{PORT:-8000}}"
"""
FILES = {"start.sh": START_SH}
# (tag, Dockerfile lines after FROM the echo image)
FORMS = {
    # (`sh -c "cd /app/env && uvicorn ..."` with PYTHONPATH set: the openenv-init image.)
    "shell-python-m": [
        f"CMD python -m uvicorn {APP} --host 0.0.0.0 --port ${{PORT:-8000}} --proxy-headers"
        " --forwarded-allow-ips '*'"
    ],
    "start-script": ["COPY start.sh /app/start.sh", 'CMD ["/app/start.sh"]'],
    "gunicorn-1": [
        'CMD ["sh", "-c", "cd /app && gunicorn -w 1 -k uvicorn.workers.UvicornWorker'
        f' -b 0.0.0.0:8000 {APP}"]'
    ],
    "entrypoint-cmd": [
        'ENTRYPOINT ["python", "-m", "uvicorn"]',
        f'CMD ["{APP}", "--host", "0.0.0.0", "--port", "8000"]',
    ],
    "workers-2": [
        f'CMD ["sh", "-c", "cd /app && uvicorn {APP} --host 0.0.0.0 --port 8000 --workers 2"]'
    ],
    # A library that forbids its use in a forked child (as some do: they end the child, or
    # hang it): only a trial copy at start can tell, since the server serves as any other.
    "fork-refusing": [
        "RUN printf 'import os\\nos.register_at_fork(after_in_child=lambda: os._exit(3))\\n"
        "from echo_env.app import app\\n' > /app/refusing_app.py",
        'CMD ["uvicorn", "refusing_app:app", "--host", "0.0.0.0", "--port", "8000"]',
    ],
    # No Python at all (the launcher needs one): a shell loop, never a server.
    "no-python": [
        'RUN for d in $(echo "$PATH" | tr : " "); do rm -f "$d"/python*; done',
        'CMD ["sh", "-c", "while :; do sleep 1; done"]',
    ],
}
REFUSED = {
    "fork-refusing": "a copy of its server could not serve",
    "no-python": "no python3 or python",
}


# The env OpenEnv's `openenv init` generates, built by the Dockerfile it generates, unchanged
# (`make image-openenv-template`): OpenEnv's echo env as OpenEnv builds it, with
# `CMD ["sh", "-c", "cd /app/env && uvicorn server.app:app ..."]`, /app/.venv, PYTHONPATH.
OPENENV_TEMPLATE = "denv-openenv-template:latest"


def image(tag: str) -> str:
    return OPENENV_TEMPLATE if tag == "openenv-init" else f"denv-live-form-{tag}:{TEST_TAG}"


@pytest.fixture(scope="module")
def form_images() -> Iterator[None]:
    """The images, built for this module (metadata layers on the echo image: seconds)."""
    with derived_images(ECHO_IMAGE, {image(t): lines for t, lines in FORMS.items()}, FILES):
        yield


def provider(server: LocalDenv, **kwargs: Any) -> DenvProvider:
    return DenvProvider(server=server.url, api_key=server.key, **kwargs)


@pytest.mark.parametrize("tag", ["openenv-init", *(t for t in FORMS if t not in REFUSED)])
def test_each_start_form_runs_live_and_forks(
    denv_server: LocalDenv, form_images: None, tag: str
) -> None:
    p = provider(denv_server)  # no option: the default is the fast path
    root = GenericEnvClient.from_docker_image(image(tag), provider=p).sync()
    ids = [p.env_id or ""]
    try:
        with root:
            reset = root.reset()
            if tag == "openenv-init":  # the generated env greets with the name it was given
                assert reset.observation["echoed_message"] == "Denv Template environment ready!"
            root.step(message(f"prefix of {tag}"))
            children = fork_clients(root, 2)
            ids += [c.provider.env_id or "" for c in children]
            with Denv(denv_server.url, denv_server.key) as d:
                assert d.get_env(ids[0]).live  # booted under the launcher
                assert [str(d.get_env(i).start) for i in ids[1:]] == ["live", "live"]
            for child in children:
                with child:
                    assert state_of(child) == state_of(root)
                    child.step(message("child"))
                    assert state_of(child)["step_count"] == state_of(root)["step_count"] + 1
    finally:
        delete_all(denv_server, ids)


@pytest.mark.parametrize("tag", list(REFUSED))
def test_a_server_that_cannot_be_copied_is_refused_with_the_reason(
    denv_server: LocalDenv, form_images: None, tag: str
) -> None:
    with Denv(denv_server.url, denv_server.key) as d:
        before = {e.id for e in d.list_envs(include_deleted=True)}
        with pytest.raises(Conflict, match=REFUSED[tag]) as exc:
            d.create_sandbox(image(tag), live=True)
        assert exc.value.code == "live_unsupported" and "without live" in str(exc.value)
        made = [e.id for e in d.list_envs(include_deleted=True) if e.id not in before]
    assert made, "the refused env has no record"
    assert_gone(denv_server, made)  # deleted, no container left


def test_the_default_keeps_a_server_that_cannot_be_copied(
    denv_server: LocalDenv, form_images: None
) -> None:
    tag = "fork-refusing"
    p = provider(denv_server)
    root = GenericEnvClient.from_docker_image(image(tag), provider=p).sync()
    ids = [p.env_id or ""]
    try:
        with root:
            root.reset()
            root.step(message("not copied"))
            with Denv(denv_server.url, denv_server.key) as d:
                env = d.get_env(ids[0])
                assert not env.live and env.live_unsupported
                assert REFUSED[tag] in env.live_unsupported
                with pytest.raises(Conflict, match=REFUSED[tag]) as exc:
                    d.fork(ids[0], kind="live")
                assert exc.value.code == "live_unsupported"
            # Its forks with the defaults boot from a snapshot of /work instead (the echo
            # env keeps its episode there).
            (child,) = fork_clients(root, 1)
            ids.append(child.provider.env_id or "")
            with child:
                assert child.provider.start != "live"
                assert state_of(child)["last_message"] == "not copied"
    finally:
        delete_all(denv_server, ids)


def test_auto_refuses_an_image_without_python(denv_server: LocalDenv, form_images: None) -> None:
    with Denv(denv_server.url, denv_server.key) as d:
        before = {e.id for e in d.list_envs(include_deleted=True)}
        with pytest.raises(Conflict, match="no python3 or python") as exc:
            d.create_sandbox(image("no-python"), live="auto")
        assert exc.value.code == "live_unsupported"
        made = [e.id for e in d.list_envs(include_deleted=True) if e.id not in before]
    assert_gone(denv_server, made)


def test_a_web_interface_forks_live_and_threads_of_its_own_fork_by_volume(
    denv_server: LocalDenv,
) -> None:
    # OpenEnv's web interface (Gradio at /web, on in the Hub's envs): denv turns Gradio's
    # analytics threads off in a live env, so it forks live. Turned back on, the server runs
    # threads of its own, which a fork would copy mid-use: auto then forks by volume.
    web = {"ENABLE_WEB_INTERFACE": "true"}
    cases = {"live": web, "cold": {**web, "GRADIO_ANALYTICS_ENABLED": "True"}}
    ids: list[str] = []
    try:
        for start, env_vars in cases.items():
            p = provider(denv_server)
            url = p.start_container(ECHO_IMAGE, env_vars=env_vars)
            ids.append(p.env_id or "")
            p.wait_for_ready(url)
            with GenericEnvClient(base_url=url, provider=p).sync() as root:
                root.reset()
                root.step(message(f"web {start}"))
                (child,) = fork_clients(root, 1)
                ids.append(child.provider.env_id or "")
                with child:
                    assert child.provider.start == start
                    assert state_of(child)["last_message"] == f"web {start}"
    finally:
        delete_all(denv_server, ids)
