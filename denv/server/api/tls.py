"""TLS for ``denv serve``, and the rule that keeps a plain-HTTP server on this machine.

    denv serve --host 0.0.0.0 --tls-cert server.pem --tls-key server.key

A server reachable from other machines carries API keys and ingress tokens (capabilities
to whole envs) on every request, so listening beyond loopback without TLS is refused unless
the operator says ``--insecure`` (e.g. behind a TLS-terminating proxy on a private
network). Clients trust the server's certificate through ``DENV_CA_BUNDLE`` or
``Denv(ca_bundle=...)`` when it is not signed by a public CA.
"""

from __future__ import annotations

import argparse
import ssl
from ipaddress import ip_address
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The TLS options of ``denv serve``."""
    parser.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        metavar="PEM",
        help="serve HTTPS with this certificate (chain) file; needs --tls-key",
    )
    parser.add_argument(
        "--tls-key",
        type=Path,
        default=None,
        metavar="PEM",
        help="the private key of --tls-cert",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow plain HTTP on an address other than loopback (API keys and ingress "
        "tokens then cross the network in clear)",
    )


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine."""
    if host == "localhost":
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the TLS options for ``args.host`` (a message for stderr), or None."""
    cert: Path | None = args.tls_cert
    key: Path | None = args.tls_key
    if (cert is None) != (key is None):
        return "--tls-cert and --tls-key go together: give both, or neither"
    if cert is not None and key is not None:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            return (
                f"cannot load --tls-cert {cert} with --tls-key {key} ({exc}): give a PEM "
                "certificate and its matching private key"
            )
        return None
    if not is_loopback(args.host) and not args.insecure:
        return (
            f"--host {args.host} listens beyond this machine without TLS: give --tls-cert "
            "and --tls-key, or --insecure to send API keys and ingress tokens in clear"
        )
    return None
