"""Defaults of the denv client, in one place.

Nothing here waits forever: every call has a timeout, every retry loop a bound.
"""

from __future__ import annotations

# Where the client looks for its server and key (argument first, then these; see denv.local).
ENV_SERVER = "DENV_SERVER"
ENV_API_KEY = "DENV_API_KEY"
# A PEM file of the CAs that signed a TLS server's certificate (`denv serve --tls-cert`), when
# it is not one the system trusts; `Denv(ca_bundle=...)` takes precedence.
ENV_CA_BUNDLE = "DENV_CA_BUNDLE"

# The local server (`denv serve`) listens here unless told otherwise.
DEFAULT_SERVER_URL = "http://127.0.0.1:7711"

API_KEY_PREFIX = "dak_"

# Seconds a plain call may take, end to end per attempt (connect, send, answer).
DEFAULT_TIMEOUT_S = 30.0
# Seconds to open a connection; short, because a server that does not accept is down.
CONNECT_TIMEOUT_S = 5.0
# Retries after the first attempt (connection failures; 429/5xx for idempotent calls only).
DEFAULT_MAX_RETRIES = 2
# Exponential backoff between attempts: INITIAL * MULTIPLIER**n, capped at MAX, with jitter.
BACKOFF_INITIAL_S = 0.5
BACKOFF_MULTIPLIER = 2.0
BACKOFF_MAX_S = 8.0
# A server's Retry-After is honored up to this many seconds.
RETRY_AFTER_MAX_S = 60.0
#: A 429 `rate_limited` (a per-key cap on work in flight) is back-pressure, not a failure:
#: it is retried after its Retry-After this many times (~5 min at the server's 1 s), so a
#: burst (64 concurrent starts) queues behind the cap instead of failing.
RATE_LIMITED_MAX_RETRIES = 300
# Statuses that say "try again later" (retried only for idempotent calls).
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})

# Contract defaults the client needs to size long-poll timeouts (see openapi/denv.yaml).
DEFAULT_CREATE_WAIT_TIMEOUT_S = 120.0  # SandboxCreate/EnvsCreate.wait_timeout_s
DEFAULT_ENV_WAIT_TIMEOUT_S = 60.0  # WaitRequest.timeout_s
# Page size for list_* iterators.
LIST_PAGE_SIZE = 100
