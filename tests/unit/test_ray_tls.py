"""The cluster's TLS files (denv/cluster/ray_tls.py), checked with a real TLS handshake on
loopback: a peer holding the cluster's certificate gets through, in both directions, and a
peer without one is refused, as Ray's gRPC (mutual TLS) treats them. Ray itself running with
these files is tested on the cluster (tests/cluster/test_ray_nodes.py)."""

from __future__ import annotations

import socket
import ssl
import stat
import threading
import time
from pathlib import Path

import pytest
from cryptography import x509

from denv.cluster import ray_tls


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ray_tls.create(tmp_path_factory.mktemp("c") / ray_tls.TLS_DIR, ["192.0.2.7"])


def test_the_files_are_private_and_the_env_names_them(tls: Path) -> None:
    assert stat.S_IMODE(tls.stat().st_mode) == 0o700
    for name in (ray_tls.CA_CERT, ray_tls.CA_KEY, ray_tls.NODE_CERT, ray_tls.NODE_KEY):
        assert stat.S_IMODE((tls / name).stat().st_mode) == 0o600, name
    env = ray_tls.tls_env(tls)
    assert env == {
        "RAY_USE_TLS": "1",
        "RAY_TLS_SERVER_CERT": str(tls / "node.crt"),
        "RAY_TLS_SERVER_KEY": str(tls / "node.key"),
        "RAY_TLS_CA_CERT": str(tls / "ca.crt"),
    }
    assert ray_tls.tls_env(tls.parent / "none") == {}


def test_the_node_certificate_names_every_address_and_the_ca_signed_it(tls: Path) -> None:
    ca = x509.load_pem_x509_certificate((tls / ray_tls.CA_CERT).read_bytes())
    node = x509.load_pem_x509_certificate((tls / ray_tls.NODE_CERT).read_bytes())
    node.verify_directly_issued_by(ca)
    sans = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(a) for a in sans.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "192.0.2.7",
    }


def _serve_once(server: ssl.SSLContext) -> tuple[int, list[str]]:
    """A loopback TLS server for one connection; the outcome lands in the list."""
    listener = socket.create_server(("127.0.0.1", 0))
    outcome: list[str] = []

    def accept() -> None:
        conn, _ = listener.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as s:
                s.sendall(b"ok")
                outcome.append("accepted")
        except (ssl.SSLError, OSError) as exc:
            outcome.append(f"refused: {exc}")
        finally:
            listener.close()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1], outcome


def _contexts(tls: Path, client_cert: bool) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tls / ray_tls.NODE_CERT, tls / ray_tls.NODE_KEY)
    server.load_verify_locations(tls / ray_tls.CA_CERT)
    server.verify_mode = ssl.CERT_REQUIRED  # as Ray's gRPC servers: the client shows one too
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(tls / ray_tls.CA_CERT)
    if client_cert:
        client.load_cert_chain(tls / ray_tls.NODE_CERT, tls / ray_tls.NODE_KEY)
    return server, client


def test_two_holders_of_the_files_connect_by_address(tls: Path) -> None:
    server, client = _contexts(tls, client_cert=True)
    port, outcome = _serve_once(server)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        client.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        assert s.recv(2) == b"ok"
    assert outcome == ["accepted"]


def test_a_peer_without_the_clusters_certificate_is_refused(tls: Path) -> None:
    server, client = _contexts(tls, client_cert=False)
    port, outcome = _serve_once(server)
    got = b""
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1") as s,
        ):
            got = s.recv(2)  # TLS 1.3: the refusal arrives after the client's handshake
    except (ssl.SSLError, ConnectionError):  # the refusal's alert, or the closed connection
        pass
    assert got != b"ok"
    deadline = time.monotonic() + 10
    while not outcome and time.monotonic() < deadline:
        time.sleep(0.01)
    assert outcome and outcome[0].startswith("refused"), outcome


def test_a_token_with_the_files_beside_it_turns_tls_on(tls: Path) -> None:
    """``ray_auth.process_env`` (every Ray process ``denv cluster up`` starts, and drivers
    through ``use_token``) adds the TLS variables where the files sit beside the token."""
    from denv.cluster import ray_auth

    token = ray_auth.create_token_file(tls.parent / ray_auth.TOKEN_FILE)
    assert ray_auth.process_env(token) == {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        **ray_tls.tls_env(tls),
    }
    alone = tls.parent / "alone"
    alone.mkdir()
    bare = ray_auth.create_token_file(alone / ray_auth.TOKEN_FILE)
    assert "RAY_USE_TLS" not in ray_auth.process_env(bare)


def test_a_node_certificate_is_issued_by_an_existing_ca_without_its_key(tmp_path: Path) -> None:
    """`denv cluster tls-cert` (Kubernetes pods, machines `up` does not start): a CA made
    once signs each node's certificate, which names the node's addresses and DNS names;
    the CA's key stays where it was."""
    ca = ray_tls.create_ca(tmp_path / "ca")
    node = ray_tls.issue(ca, tmp_path / "node", ["10.1.2.3"], ["denv-ray.denv-system.svc"])
    assert sorted(p.name for p in node.iterdir()) == ["ca.crt", "node.crt", "node.key"]
    cert = x509.load_pem_x509_certificate((node / "node.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(a) for a in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.1.2.3"}
    assert set(sans.get_values_for_type(x509.DNSName)) == {"localhost", "denv-ray.denv-system.svc"}
    ca_cert = x509.load_pem_x509_certificate((ca / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca_cert)
    assert stat.S_IMODE((node / "node.key").stat().st_mode) == 0o600


def test_issuing_without_a_ca_or_with_a_bad_address_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ray_tls.TLSError, match="denv cluster tls-ca --out"):
        ray_tls.issue(tmp_path / "none", tmp_path / "node", ["10.1.2.3"])
    ca = ray_tls.create_ca(tmp_path / "ca")
    with pytest.raises(ray_tls.TLSError, match=r"not an IP address \(names go in --dns\)"):
        ray_tls.issue(ca, tmp_path / "node", ["denv-ray"])
    assert not (tmp_path / "node").exists(), "a refused certificate left a directory"
