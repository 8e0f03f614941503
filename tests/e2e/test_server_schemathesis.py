"""The server against its own contract: schemathesis over openapi/denv.yaml.

Every generated request (valid and invalid) must get a documented status, never a 5xx, with
a body that conforms to the spec. Creates are steered away from real containers: the image
of a sandbox and the images of a compose file are replaced by names the engine does not have
(so creates fail fast with 422 ``image_not_found``), ``pull`` is never true, and an egress
allowlist holds literal addresses (a generated name would be looked up). Whatever a
case still creates is deleted by the server fixture at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from conftest import LocalDenv
from hypothesis import HealthCheck, settings
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import positive_data_acceptance

pytestmark = pytest.mark.e2e

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "denv.yaml"
MISSING_IMAGE = "denv-schemathesis-missing:0"

schema = schemathesis.openapi.from_path(SPEC)


def steer(case: Any) -> None:
    """Keep valid creates from starting containers or pulling."""
    body = case.body
    if not isinstance(body, dict):
        return
    if case.operation.path == "/v1/sandboxes":
        if isinstance(body.get("image"), str):
            body["image"] = MISSING_IMAGE
        if body.get("pull") is True:
            body["pull"] = False
    egress = body.get("egress")
    if isinstance(egress, dict) and isinstance(egress.get("allow"), list):
        # The server resolves allowlist names with this machine's resolver: a generated name
        # would send a DNS query off the machine. Literal addresses in 198.18.0.0/15 instead.
        # Other values are kept, so a case meant to be invalid stays invalid.
        egress["allow"] = [
            f"198.18.0.{i % 250 + 1}:80" if isinstance(e, str) and e else e
            for i, e in enumerate(egress["allow"])
        ]
    if case.operation.path.endswith("/deploy") and isinstance(body.get("compose"), str):
        body["compose"] = body["compose"].replace("image:", "image: " + MISSING_IMAGE + " #")


@schema.parametrize()
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
def test_server_conforms_to_contract(case: Any, denv_server: LocalDenv) -> None:
    steer(case)
    # A case that breaks the headers on purpose (e.g. drops Authorization) is sent as made;
    # every other case carries the server's key.
    meta = case.meta
    if meta is not None and meta.is_negative_at(ParameterLocation.HEADER):
        headers = None
    else:
        headers = {"Authorization": f"Bearer {denv_server.key}"}
    # Valid creates are steered to a missing image, so their 422 image_not_found is expected.
    steered = case.operation.path in ("/v1/sandboxes", "/v1/projects/{name}/deploy")
    case.call_and_validate(
        base_url=denv_server.url,
        headers=headers,
        timeout=60,
        excluded_checks=[positive_data_acceptance] if steered else None,
    )
