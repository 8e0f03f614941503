"""Ray's TLS for a denv cluster: every Ray connection encrypted, both ends checked.

With ``RAY_USE_TLS=1`` every Ray process (GCS, raylets, workers such as the node agents,
drivers such as ``denv serve --cluster``) speaks gRPC over TLS with the certificate and key
that ``RAY_TLS_SERVER_CERT`` and ``RAY_TLS_SERVER_KEY`` name, and accepts only peers whose
certificate the CA of ``RAY_TLS_CA_CERT`` signed: mutual TLS. A client checks that the
server's certificate names the address it dialled, so the certificate lists every node's
address. Together with the token (``ray_auth``) this keeps out whoever lacks the cluster's
files, and keeps the token and the calls off the wire in clear.

    create(cluster_dir / TLS_DIR, ["127.0.0.1", "10.0.0.5"])  # a CA of the cluster's own
    env = tls_env(cluster_dir / TLS_DIR)                       # {} when there is none

The CA's key is only needed to issue certificates; ``create`` keeps it (0600) beside the
others, so that a node added later can be given one. Where machines are not started by
``denv cluster up`` (Kubernetes pods, whose addresses are known only when they start),
``create_ca`` makes the CA once and ``issue`` gives each node its own certificate
(``denv cluster tls-ca`` and ``tls-cert``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

TLS_DIR = "ray-tls"
CA_CERT, CA_KEY = "ca.crt", "ca.key"
NODE_CERT, NODE_KEY = "node.crt", "node.key"
VALID_DAYS = 365
USE_VAR, CERT_VAR, KEY_VAR, CA_VAR = (
    "RAY_USE_TLS",
    "RAY_TLS_SERVER_CERT",
    "RAY_TLS_SERVER_KEY",
    "RAY_TLS_CA_CERT",
)
TLS_VARS = (USE_VAR, CERT_VAR, KEY_VAR, CA_VAR)
CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "denv cluster CA")])
NODE_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "denv cluster node")])


class TLSError(Exception):
    """A CA or certificate cannot be made: the message names what and the fix."""


def create(directory: Path, addresses: Sequence[str]) -> Path:
    """A new CA and one certificate for every Ray process of the cluster, naming
    ``addresses`` (and loopback), in ``directory`` (made 0700; keys 0600). Returns it."""
    create_ca(directory)
    return issue(directory, directory, addresses)


def create_ca(directory: Path) -> Path:
    """A new CA (``ca.crt``, ``ca.key``) in ``directory`` (made 0700; the key 0600)."""
    _private_dir(directory)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        _builder(CA_NAME, CA_NAME, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(directory / CA_KEY, _key_pem(ca_key))
    _write(directory / CA_CERT, ca.public_bytes(serialization.Encoding.PEM))
    return directory


def issue(
    ca_dir: Path, directory: Path, addresses: Sequence[str], dns_names: Sequence[str] = ()
) -> Path:
    """A node certificate and key signed by the CA of ``ca_dir``, naming ``addresses``,
    ``dns_names``, loopback and ``localhost``, in ``directory`` beside a copy of the CA's
    certificate (never its key, unless ``directory`` is ``ca_dir``). Returns ``directory``.

    A Kubernetes pod runs this at its start (``denv cluster tls-cert``) with its own
    address, since pod addresses are known only then."""
    try:
        ca = x509.load_pem_x509_certificate((ca_dir / CA_CERT).read_bytes())
        ca_key = serialization.load_pem_private_key((ca_dir / CA_KEY).read_bytes(), None)
    except (OSError, ValueError) as exc:
        raise TLSError(
            f"no CA in {ca_dir} ({exc}): make one with `denv cluster tls-ca --out {ca_dir}`"
        ) from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TLSError(f"{ca_dir / CA_KEY} is not an EC key made by `denv cluster tls-ca`")
    names: list[x509.GeneralName] = [
        x509.DNSName(n) for n in dict.fromkeys(["localhost", *dns_names])
    ]
    for address in dict.fromkeys(["127.0.0.1", *addresses]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            raise TLSError(f"{address!r} is not an IP address (names go in --dns)") from None
    _private_dir(directory)
    now = datetime.datetime.now(datetime.UTC)
    node_key = ec.generate_private_key(ec.SECP256R1())
    node = (
        _builder(NODE_NAME, ca.subject, node_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(directory / NODE_KEY, _key_pem(node_key))
    _write(directory / NODE_CERT, node.public_bytes(serialization.Encoding.PEM))
    if directory.resolve() != ca_dir.resolve():
        _write(directory / CA_CERT, ca.public_bytes(serialization.Encoding.PEM))
    return directory


def _private_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)


def tls_env(directory: Path) -> dict[str, str]:
    """The variables that make a Ray process use the cluster's TLS files in ``directory``;
    ``{}`` when it holds none (a cluster without TLS)."""
    if not (directory / CA_CERT).is_file():
        return {}
    return {
        USE_VAR: "1",
        CERT_VAR: str(directory / NODE_CERT),
        KEY_VAR: str(directory / NODE_KEY),
        CA_VAR: str(directory / CA_CERT),
    }


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey, now: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little apart
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes) -> None:
    """``data`` in ``path``, mode 0600 from the moment it exists."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
