#!/usr/bin/env bash
# `make test`'s pytest runs, in two lanes at once, then the reliability dir alone.
#
# The tests mostly wait on engines, boots and leases, not on CPU (a one-lane CI run sampled
# every 5 s was 52% idle), so two pytest processes share the machine:
#   lane 1: the browser, cassette, e2e, framework, server and unit tests;
#   lane 2: tests/cluster (local Ray clusters), then the live-fork e2e tests from the
#           installed wheel (scripts/test_installed.sh), then the e2e modules listed in
#           LANE2 (self-contained and long: the docs' blocks, exports, the TRL example).
# tests/reliability starts once both lanes are done, with the machine to itself (and with it
# the e2e modules in ALONE_E2E): it measures
# under load (the flood's ratios) and touches the machine's engine and firewall (a dockerd
# restart, egress rules), which would disturb whatever else ran. Only its modules listed in
# SHARED (a server of their own, API-level checks, no engine-wide or timing effect) run in
# lane 1 instead; a new reliability module runs alone unless added there.
#
# Arguments are pytest options for every run (e.g. -x, -k NAME). Every run goes to its end;
# the exit code is the first failing run's. JUnit reports: .cache/test-report*.xml
# (scripts/test_times.py sums them); lane 2's output is printed after lane 1's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .cache
rm -f .cache/test-report*.xml

LANE2=(
  tests/e2e/test_bench_smoke.py
  tests/e2e/test_docs_snippets.py
  tests/e2e/test_export.py
  tests/e2e/test_export_harbor.py
  tests/e2e/test_trl_grpo.py
)

# e2e modules that run with the reliability dir, alone: gVisor's boots on the ptrace platform
# take every core for tens of seconds (16 gunicorn workers booting under gvisor: ~100 s),
# which starved timing-bound tests of the other lane (ksmd's scans, browser waits).
ALONE_E2E=(
  tests/e2e/test_gvisor.py
  tests/e2e/test_gvisor_shapes.py
)

SHARED=(
  tests/reliability/test_bad_input.py
  tests/reliability/test_hardening.py
  tests/reliability/test_isolation.py
  tests/reliability/test_secrets.py
  tests/reliability/test_tls.py
  tests/reliability/test_token_digests.py
)
ALONE=("${ALONE_E2E[@]}")
for module in tests/reliability/test_*.py; do
  case " ${SHARED[*]} " in *" $module "*) ;; *) ALONE+=("$module") ;; esac
done

# pytest's exit 5 (nothing collected, e.g. -k matched no test of a run) is not a failure.
run() {
  "$PY" -m pytest -q "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then rc=0; fi
  return "$rc"
}

# The first of its arguments that is not 0, else 0: the exit code of runs that all ran.
first_failed() {
  local rc
  for rc in "$@"; do
    if [ "$rc" -ne 0 ]; then return "$rc"; fi
  done
  return 0
}

lane2() {
  local cluster=0 installed=0 modules=0
  run --durations=15 --junitxml=.cache/test-report-cluster.xml tests/cluster "$@" || cluster=$?
  scripts/test_installed.sh || installed=$?
  run --durations=15 --junitxml=.cache/test-report-lane2.xml "${LANE2[@]}" "$@" || modules=$?
  first_failed "$cluster" "$installed" "$modules"
}

log=.cache/test-lane2.log
lane2 "$@" >"$log" 2>&1 &
second=$!
trap 'kill "$second" 2>/dev/null' INT TERM

ignore=(--ignore=tests/cluster)
for module in "${LANE2[@]}" "${ALONE[@]}"; do ignore+=("--ignore=$module"); done
first=0
run --durations=30 --junitxml=.cache/test-report.xml "${ignore[@]}" tests "$@" || first=$?
wait "$second"
lane=$?
echo "== lane 2: tests/cluster, the installed wheel's live-fork tests, ${LANE2[*]} (exit $lane) =="
cat "$log"

echo "== tests/reliability (but SHARED) and ${ALONE_E2E[*]}, alone =="
alone=0
run --durations=15 --junitxml=.cache/test-report-reliability.xml "${ALONE[@]}" "$@" || alone=$?

first_failed "$first" "$lane" "$alone"
