#!/usr/bin/env python3
"""Record DenvProvider's HTTP cassettes against a real local denv server.

    .venv/bin/python scripts/record_provider_cassettes.py               # every scenario
    .venv/bin/python scripts/record_provider_cassettes.py fork_n ready  # only these

Needs Docker and the images the scenarios run (denv-echo-env:latest, denv-base-probe:latest).
Like scripts/record_cassettes.py, whose scrubbing it uses (keys, ingress tokens, ids,
timestamps, addresses), it starts `python -m denv.server --port 0` on a temporary state
directory, gives each scenario of tests/unit/provider_scenarios.py an API key of its own, and
writes tests/cassettes/provider_<name>.yaml. The WebSocket half of readiness runs for real
here (vcrpy records HTTP only); the replay stands in for it.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
CASSETTES = ROOT / "tests" / "cassettes"
PREFIX = "provider_"

log = logging.getLogger("record_provider_cassettes")


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def record(names: list[str], out: Path) -> None:
    """Record `names` (every scenario when empty) into `out`."""
    import vcr
    from denv.openenv._readiness import probe_websocket

    from denv.server.auth import create_api_key

    facade = _load("record_cassettes", ROOT / "scripts" / "record_cassettes.py")
    scenarios = _load("provider_scenarios", ROOT / "tests" / "unit" / "provider_scenarios.py")
    server = _load("denv_test_server", ROOT / "tests" / "conftest.py")
    names = names or list(scenarios.SCENARIOS)
    unknown = sorted(set(names) - set(scenarios.SCENARIOS))
    if unknown:
        raise SystemExit(f"no such scenario: {', '.join(unknown)} (see {scenarios.__file__})")
    recorder = vcr.VCR(
        record_mode="all", match_on=["method", "path"], decode_compressed_response=True
    )
    out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="denv-provider-cassettes-") as tmp,
        server.start_server(Path(tmp) / "state") as srv,
    ):
        log.info("recording against %s", srv.url)
        for name in names:
            key = create_api_key(srv.state_dir)
            path = out / f"{PREFIX}{name}.yaml"
            path.unlink(missing_ok=True)
            started = time.monotonic()
            with recorder.use_cassette(str(path)):
                scenarios.SCENARIOS[name](srv.url, key, probe_websocket)
            facade.scrub_file(path, srv.url)
            log.info("%s: %s (%.1fs)", name, path.relative_to(ROOT), time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="scenarios to record (default: all)")
    parser.add_argument("--out", type=Path, default=CASSETTES, help="default %(default)s")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "vcr"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    record(args.names, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
