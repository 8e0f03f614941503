"""TLS: ``denv serve --tls-cert/--tls-key`` with a self-signed certificate made here.

The Denv client reaches it with ``ca_bundle=`` (and ``DENV_CA_BUNDLE``), and refuses it
without; an env's ingress URL is https and answers through the same certificate; a server
asked to listen beyond loopback without TLS refuses to start unless given ``--insecure``.
"""

from __future__ import annotations

import datetime
import ssl
import subprocess
import sys
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path

import httpx
import pytest
from conftest import LocalDenv, start_server
from reliability_helpers import STANDIN, STANDIN_CMD, report

from denv import Denv
from denv.errors import ConnectionFailed

pytestmark = pytest.mark.e2e


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:
        pytest.fail(f"the cryptography package is missing ({exc}): install the dev venv")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "denv test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalDenv, Path]]:
    certs = tmp_path_factory.mktemp("denv-tls-certs")
    cert, key = self_signed(certs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DENV_CA_BUNDLE", str(cert))  # start_server's health probe (denv.local)
        state = tmp_path_factory.mktemp("denv-tls")
        with start_server(state, "--tls-cert", str(cert), "--tls-key", str(key)) as srv:
            yield srv, cert


def test_the_client_talks_to_a_tls_server(
    tls_server: tuple[LocalDenv, Path],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    srv, cert = tls_server
    assert srv.url.startswith("https://"), srv.url
    monkeypatch.delenv("DENV_CA_BUNDLE")
    with Denv(srv.url, srv.key, max_retries=0) as untrusting, pytest.raises(ConnectionFailed):
        untrusting.health()
    with Denv(srv.url, srv.key, ca_bundle=cert) as denv:
        assert denv.health().status == "ok"
        assert list(denv.list_versions()) == []  # an authenticated call
    headers = {"Authorization": f"Bearer {srv.key}"}
    trust = ssl.create_default_context(cafile=str(cert))
    with httpx.Client(base_url=srv.url, headers=headers, verify=trust, timeout=120) as c:
        res = c.post("/v1/sandboxes", json={"image": STANDIN, "command": STANDIN_CMD})
        assert res.status_code == 201, res.text
        env = res.json()
        try:
            url = env["endpoints"][0]["url"]
            assert url.startswith("https://"), url
            res = c.get(f"{url}/health")
            assert res.status_code == 200, res.text
        finally:
            c.delete(f"/v1/envs/{env['id']}")
    monkeypatch.setenv("DENV_CA_BUNDLE", str(cert))
    with Denv(srv.url, srv.key) as from_env:
        assert from_env.health().status == "ok"
    report(
        request,
        "tls: a self-signed server answered the client with ca_bundle= and DENV_CA_BUNDLE, "
        "refused it without; an env's https ingress URL answered",
    )


def test_plain_http_beyond_loopback_needs_insecure(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "denv.server", "--port", "0", "--state-dir", str(tmp_path)]
    out = subprocess.run(
        [*cmd, "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 2, out
    assert "--tls-cert" in out.stderr and "--insecure" in out.stderr, out.stderr
    assert not (tmp_path / "server.json").exists()
