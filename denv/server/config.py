"""Server configuration and the limits of the contract, in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7711
DEFAULT_MAX_ENVS_PER_KEY = 64

MAX_COUNT = 32  # envs per fork / create-from-version request
MAX_BODY_BYTES = 1024 * 1024
LAYER_DEPTH_LIMIT = 8  # past this many layers a volume's stack is merged into one
HEALTH_POLL_S = 0.02  # how often the agent's health path is polled while starting
EXIT_CHECK_EVERY = 10  # check that the container still runs every N health polls
LOG_TAIL_LINES = 50  # log lines kept in a failed env's error
REAPER_INTERVAL_S = 5.0
IDEMPOTENCY_TTL_S = 24 * 3600
DOCKER_TIMEOUT_S = 120
START_WORKERS = 64  # threads that start envs (fork(n) starts its children in parallel)


def default_state_dir() -> Path:
    """``$DENV_STATE_DIR`` or ``~/.local/share/denv``."""
    env = os.environ.get("DENV_STATE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "share" / "denv"


@dataclass(frozen=True)
class ServerConfig:
    """What one ``denv serve`` process needs to know."""

    state_dir: Path
    api_key: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_envs_per_key: int = DEFAULT_MAX_ENVS_PER_KEY
    base_url: str = ""  # the URL clients use; ingress URLs start with it

    @property
    def db_path(self) -> Path:
        return self.state_dir / "denv.db"

    @property
    def layers_dir(self) -> Path:
        return self.state_dir / "layers"

    @property
    def envs_dir(self) -> Path:
        return self.state_dir / "envs"

    def public_url(self) -> str:
        if self.base_url:
            return self.base_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"
