"""The few denv API calls an exported environment makes: start an env from its version, delete it.

This package runs inside the exported image, on whatever Python and OpenEnv the version's
agent image has, so it speaks denv's public HTTP contract (v1) with httpx (an OpenEnv
dependency) instead of requiring the denv package. Credentials come from the environment
(DENV_SERVER, DENV_API_KEY) and are never written to disk or logged.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

import httpx

log = logging.getLogger(__name__)

SERVER_VAR = "DENV_SERVER"
KEY_VAR = "DENV_API_KEY"
#: Seconds the server may take to start an env and see it healthy (the contract's maximum is 600).
WAIT_TIMEOUT_S = float(os.environ.get("DENV_WAIT_TIMEOUT_S", "120"))
#: Seconds until the server deletes an env this package started and then lost track of.
ENV_TTL_S = int(os.environ.get("DENV_ENV_TTL_S", "3600"))
#: Booted spares the server keeps for the next reset (versions whose images allow warm forks).
WARM = int(os.environ.get("DENV_WARM", "0"))
_RETRIES = 2


class DenvApiError(RuntimeError):
    """A denv call failed; the message says what happened and what to do."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class DenvApi:
    """A denv server at `server`, called with `api_key`."""

    def __init__(self, server: str, api_key: str, timeout_s: float = 30.0) -> None:
        self.server = server.rstrip("/")
        self._http = httpx.Client(
            base_url=self.server,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
        )

    @classmethod
    def from_environ(cls) -> DenvApi:
        server, key = os.environ.get(SERVER_VAR, ""), os.environ.get(KEY_VAR, "")
        missing = [name for name, value in ((SERVER_VAR, server), (KEY_VAR, key)) if not value]
        if missing:
            raise DenvApiError(
                f"{' and '.join(missing)} not set: this environment starts its envs on a denv "
                f"server; run the container with -e {SERVER_VAR}=http://HOST:PORT "
                f"-e {KEY_VAR}=dak_... (see README.md)"
            )
        return cls(server, key)

    def start_env(self, version_id: str, labels: dict[str, str]) -> dict[str, Any]:
        """A new env from `version_id`, healthy (its agent service answers its health path)."""
        body = {
            "count": 1,
            "wait": "healthy",
            "wait_timeout_s": WAIT_TIMEOUT_S,
            "ttl_s": ENV_TTL_S,
            "labels": labels,
        }
        if WARM:
            body["warm"] = WARM
        # One key for every attempt: a retry after a lost answer gets the same env back.
        headers = {"Idempotency-Key": f"denv-export-{uuid.uuid4().hex}"}
        data = self._call(
            "POST",
            f"/v1/versions/{version_id}/envs",
            json=body,
            headers=headers,
            timeout=WAIT_TIMEOUT_S + 30.0,
        )
        env: dict[str, Any] = data["envs"][0]
        if env.get("status") != "healthy":
            error = (env.get("error") or {}).get("message") or f"status {env.get('status')}"
            self.delete_env(env["id"])
            raise DenvApiError(f"env {env['id']} from version {version_id} did not start: {error}")
        return env

    def delete_env(self, env_id: str) -> None:
        """Delete `env_id`; an env that is already gone is fine."""
        try:
            self._call("DELETE", f"/v1/envs/{env_id}")
        except DenvApiError as exc:
            if exc.status != 404:
                raise

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        for attempt in range(_RETRIES + 1):
            try:
                response = self._http.request(method, path, **kwargs)
                break
            except httpx.TransportError as exc:
                # Only connection failures are retried: the request never reached the server
                # (and creates carry an Idempotency-Key besides).
                if attempt == _RETRIES or not isinstance(exc, httpx.ConnectError):
                    raise DenvApiError(
                        f"cannot reach the denv server at {self.server} ({exc}): check "
                        f"{SERVER_VAR} and that the container can reach that address"
                    ) from exc
                time.sleep(0.5 * (attempt + 1))
        if response.status_code == 204 or not response.content:
            return {}
        data: Any = response.json() if _is_json(response) else {}
        if response.is_success:
            return data if isinstance(data, dict) else {}
        code = data.get("code", "error") if isinstance(data, dict) else "error"
        message = data.get("message", response.text[:200]) if isinstance(data, dict) else ""
        hint = f" (check {KEY_VAR})" if response.status_code == 401 else ""
        raise DenvApiError(
            f"{method} {path}: {response.status_code} {code}: {message}{hint}",
            response.status_code,
        )


def _is_json(response: httpx.Response) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.startswith("application/json")


def agent_url(env: dict[str, Any], service: str, port: int) -> str:
    """The base URL of `service`'s `port` in `env` (an Env as the API returns it)."""
    for endpoint in env.get("endpoints") or []:
        if endpoint.get("service") == service and endpoint.get("port") == port:
            return str(endpoint["url"]).rstrip("/")
    raise DenvApiError(
        f"env {env.get('id')} has no endpoint for service '{service}' port {port}: "
        "was the version changed since this package was exported? Export it again."
    )
