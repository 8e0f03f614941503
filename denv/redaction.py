"""What never reaches a log line: ingress tokens, API keys, credential headers.

An ingress URL (``<server>/ingress/<token>/...``) is a capability: whoever reads it reaches
the env. Every log line that could hold one (uvicorn's WebSocket and access lines, an
error's request path, a traceback) shows ``/ingress/sha256:<8 hex>`` instead: the first 8
hex digits of the token's SHA-256. That is the start of the ``sha256:<hex>`` ref the
server's database keeps for the route, so an operator can still tell which env a line is
about and which requests used the same token, while 32 bits of a hash of a 192-bit token
give nothing towards the token itself, and a ``:`` is never in a token, so the logged path
cannot be replayed as a URL.

The host form of an ingress URL (``http://<label>.localhost:7711/``, ``denv.ingress_host``)
holds the token too, as a lowercase base32 label: a DEBUG log of a handshake shows it in
the ``Host`` and ``Origin`` headers. A label that decodes to a token becomes the same
``sha256:<8 hex>`` as that token's path form.

The same pass hides what a DEBUG log of a handshake would show: the value of an
``Authorization``, ``Proxy-Authorization``, ``X-API-Key``, ``Cookie`` or ``Set-Cookie``
header, a ``Bearer`` credential, a key-like query parameter (``?api_key=``, ``?token=``
...), and any denv API key (``dak_...``) wherever it appears.

    redact("GET /ingress/AbC.../ws?x=1")     # 'GET /ingress/sha256:1f0c9a2e/ws?x=1'
    redact("< authorization: Bearer dak_x")  # '< authorization: ***'
    redact("< Host: vl7tfbbc...ywtcrmwf.localhost:7711")  # '< Host: sha256:1f0c9a2e.localhost:7711'
    handler.addFilter(RedactSecrets())       # every record through the handler
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from typing import Any

from denv.ingress_host import token_of_label

__all__ = ["HIDDEN", "RedactSecrets", "redact"]

# Everything from "/ingress/" to the next path, query or fragment separator, space or
# quote: a near miss of a token (one character off, an odd character in it) is hidden too.
_INGRESS_TOKEN = re.compile(r"/ingress/([^/\s\"'?#]+)")
_REDACTED = re.compile(r"sha256:[0-9a-f]{8}")
# The server's own source folder (denv/server/ingress/proxy.py in a traceback): a token has
# no "." in it, so a Python file's name is never one.
_SOURCE_FILE = re.compile(r"[A-Za-z_]\w*\.pyc?|__pycache__")
_MARK = "/ingress/"
# A host label (lowercase base32 of a token, 26 characters for 128 bits, 39 for the server's
# 192) right before a dot; only one that decodes to a token is hidden (token_of_label).
_HOST_LABEL = re.compile(r"(?i)(?<![\w-])([a-z2-7]{26,63})(?=\.)")
HIDDEN = "***"
_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|x-api-key|(?:set-)?cookie)(\s*[:=]\s*)([^\r\n]+)"
)
_QUERY = re.compile(
    r"(?i)([?&](?:api[_-]?key|key|(?:access[_-]|auth[_-])?token|password|secret)=)[^&#\s\"']+"
)
_API_KEY = re.compile(r"dak_[A-Za-z0-9_-]+")
_BEARER = re.compile(r"(?i)\b(bearer\s+)(?!\*\*\*)[A-Za-z0-9._~+/=-]+")


def _digest_prefix(match: re.Match[str]) -> str:
    token = match.group(1)
    if _REDACTED.fullmatch(token) or _SOURCE_FILE.fullmatch(token):  # redacted already
        return match.group(0)
    digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{_MARK}sha256:{digest[:8]}"


def _label_digest(match: re.Match[str]) -> str:
    token = token_of_label(match.group(1))
    if token is None:
        return match.group(0)
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:8]


def _header_value(match: re.Match[str]) -> str:
    if match.group(3) == HIDDEN:  # redacted already
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}{HIDDEN}"


def redact(text: str) -> str:
    """``text`` with each ``/ingress/<token>`` replaced by ``/ingress/sha256:<8 hex>`` (and
    each host label of a token by ``sha256:<8 hex>``), and credentials (header values,
    key-like query parameters, denv keys) by ``***``."""
    if _MARK in text:
        text = _INGRESS_TOKEN.sub(_digest_prefix, text)
    if "." in text:
        text = _HOST_LABEL.sub(_label_digest, text)
    if "dak_" in text:
        text = _API_KEY.sub("dak_" + HIDDEN, text)
    text = _HEADER.sub(_header_value, text)
    text = _BEARER.sub(r"\1" + HIDDEN, text)
    if "=" in text:
        text = _QUERY.sub(r"\1" + HIDDEN, text)
    return text


def _redact_arg(arg: Any) -> Any:
    if isinstance(arg, str):
        return redact(arg)
    if arg is None or isinstance(arg, int | float):
        return arg
    try:
        text = str(arg)  # a URL object, bytes, an exception: what %s would print
    except Exception:
        return arg
    hidden = redact(text)
    return hidden if hidden != text else arg


class RedactSecrets(logging.Filter):
    """Redacts ingress tokens and credentials from a record: message, arguments, traceback.

    On a logger it covers that logger's own records (uvicorn's, whose formatters read the
    arguments, so their number and types are kept); on a handler, every record the handler
    writes, from whichever logger. A secret split over several arguments is caught on the
    rendered message, which then replaces them.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        else:
            record.msg = _redact_arg(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(a) for a in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {k: _redact_arg(v) for k, v in record.args.items()}
        try:
            text = record.getMessage()
        except Exception:  # a bad format: logging would print the raw message and arguments
            text = f"{record.msg} {record.args!r}"
            record.msg, record.args = redact(text), ()
        else:
            if redact(text) != text:
                record.msg, record.args = redact(text), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True
