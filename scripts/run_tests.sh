#!/usr/bin/env bash
# `make test`'s pytest run, in two lanes at once: tests/cluster (local Ray clusters, which
# mostly wait on Ray and on engines) beside the first dirs of the others (browser, cassettes,
# e2e), so that the run uses the CPU its waits leave idle (a CI run sampled every 5 s was
# 52% idle with one lane). The cluster lane ends well before the reliability dir starts, so
# the tests that measure under load (the flood's ratios) or touch the machine's engine and
# firewall (engine faults, egress) run without it. Both lanes run to the end; the exit code
# is the first failing lane's. Reports: .cache/test-report.xml and test-report-cluster.xml
# (scripts/test_times.py sums either); the cluster lane's output is printed after the other's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .cache
log=.cache/test-cluster.log
"$PY" -m pytest -q --durations=15 --junitxml=.cache/test-report-cluster.xml tests/cluster \
  >"$log" 2>&1 &
cluster=$!
trap 'kill "$cluster" 2>/dev/null' INT TERM
"$PY" -m pytest -q --durations=30 --junitxml=.cache/test-report.xml --ignore=tests/cluster "$@"
main=$?
wait "$cluster"
lane=$?
echo "== tests/cluster, run beside the others (exit $lane) =="
cat "$log"
if [ "$main" -ne 0 ]; then exit "$main"; fi
exit "$lane"
