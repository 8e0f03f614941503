"""An allowlist egress, as the facade and the provider take it and as an Env returns it.

No server: the request bodies are built and read back; the server's checks of the entries
are in tests/server/test_egress_policy.py, its behaviour in
tests/reliability/test_egress_private.py.
"""

from __future__ import annotations

import pytest
from denv.openenv import DenvProvider
from denv.openenv._config import ProviderConfig
from denv_api_client import models as api
from facade_fakes import env_json

from denv import EgressAllowlist, Env
from denv.client._requests import egress_body

ENTRIES = ["host.docker.internal:8100", "10.1.2.0/24"]


def test_a_dict_or_an_egress_allowlist_becomes_the_contracts_allowlist() -> None:
    for given in ({"allow": ENTRIES}, EgressAllowlist(allow=tuple(ENTRIES))):
        body = egress_body(given)
        assert isinstance(body, api.EgressAllowlist)
        assert body.to_dict() == {"allow": ENTRIES}
    assert egress_body("deny") == api.Egress.DENY


@pytest.mark.parametrize(
    "bad", [{"allow": "10.0.0.1"}, {"deny": ["x"]}, {"allow": ENTRIES, "x": 1}]
)
def test_a_malformed_allowlist_is_refused_before_any_request(bad: object) -> None:
    with pytest.raises(ValueError, match=r"\{'allow': \['name-or-cidr\[:port\]'"):
        egress_body(bad)  # type: ignore[arg-type]


def test_an_env_shows_its_allowlist() -> None:
    raw = env_json()
    raw["egress"] = {"allow": ENTRIES}
    env = Env.from_api(api.Env.from_dict(raw))
    assert env.egress == EgressAllowlist(allow=tuple(ENTRIES))


def test_the_provider_keeps_an_allowlist_for_itself_and_its_forks() -> None:
    config = ProviderConfig(egress={"allow": ENTRIES})
    assert config.egress == EgressAllowlist(allow=tuple(ENTRIES))
    hash(config.egress)  # frozen: shared by a provider's forks
    for bad in ({"allow": []}, {"allow": "x"}, "open"):
        with pytest.raises(ValueError, match="allowlist such as"):
            DenvProvider(egress=bad)  # type: ignore[arg-type]
