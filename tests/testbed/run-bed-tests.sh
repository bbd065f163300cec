#!/usr/bin/env bash
# `make test-bed`: start the bed, run tests/bed and tests/e2e against it, always stop it again.
# A bed that fails to start, a failing test, or no collected bed test (pytest exit 5) all fail.
# Extra arguments go to pytest. KVSCALE_BED_KEEP=1 leaves the bed up afterwards (debugging);
# KVSCALE_BED_TEST_TIMEOUT_S (default 300) is the per-test deadline; KVSCALE_BED_TESTS (default
# "tests/bed tests/e2e") the test paths (`make test-vllm` runs tests/realvllm here).
# KVSCALE_BED_LANES (default 3): the bed tests run in that many pytest-xdist workers at once, a whole
# file to a worker (most of their time is waiting on simulated load and start-ups: with three lanes
# the 2 cores were still idle half the time); then the tests marked `bed_exclusive` (faults that restart the
# API server, cluster-wide operators, the CRD upgrade, the multi-node tests that take every H100
# node) run alone. KVSCALE_BED_LANES=1 runs everything in one pytest, in order.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
PYTEST=${PYTEST:-$REPO_ROOT/.venv/bin/pytest}

finish() {
  if [ -n "${KVSCALE_BED_KEEP:-}" ]; then
    tb_log "KVSCALE_BED_KEEP is set: leaving the bed up (make testbed-down stops it)"
  else
    bash "$TESTBED_DIR/down.sh" || tb_log "down.sh failed"
  fi
}
trap finish EXIT

T0=$(date +%s)
if ! bash "$TESTBED_DIR/up.sh"; then
  tb_log "FAILED: the test bed did not start (see the log tails above; CI=${CI:-unset})"
  exit 1
fi
T1=$(date +%s)
tb_log "bed up in $((T1 - T0))s; running the bed tests"

# A per-test deadline (pytest-timeout) so a hung test fails the run instead of stalling CI; the 15
# slowest tests are listed (where the CI budget goes).
# Its output is kept so that a failure's own lines can be repeated last, below the long log tails
# (a CI report shows only the end of the output).
PYTEST_OUT="$LOGS/../pytest-bed.out"
: >"$PYTEST_OUT"
LANES=${KVSCALE_BED_LANES:-3}
bed_pytest() {  # a pytest over the bed tests (extra arguments first), its output kept; prints its exit status
  local started rc
  started=$(date +%s)
  # shellcheck disable=SC2086 # the test paths are words
  KVSCALE_BED=1 "$PYTEST" -q -rfE --durations=15 --timeout="${KVSCALE_BED_TEST_TIMEOUT_S:-300}" "$@" \
    ${KVSCALE_BED_TESTS:-tests/bed tests/e2e} "${EXTRA_ARGS[@]}" 2>&1 | tee -a "$PYTEST_OUT" >&2
  rc=${PIPESTATUS[0]}
  tb_log "pytest ($*) exit $rc after $(($(date +%s) - started))s"
  echo "$rc"
}
EXTRA_ARGS=("$@")
if [ "$LANES" -gt 1 ]; then
  rc_shared=$(bed_pytest -n "$LANES" --dist loadfile -m "not bed_exclusive")
  rc_alone=$(bed_pytest -m bed_exclusive)
  # 5 is "no test collected": fine for one phase (a path with no exclusive test), not for both
  if [ "$rc_shared" -eq 5 ] && [ "$rc_alone" -eq 5 ]; then rc=5
  elif [ "$rc_shared" -ne 0 ] && [ "$rc_shared" -ne 5 ]; then rc=$rc_shared
  elif [ "$rc_alone" -ne 0 ] && [ "$rc_alone" -ne 5 ]; then rc=$rc_alone
  else rc=0
  fi
else
  rc=$(bed_pytest)
fi
tb_log "bed tests exit $rc after $(($(date +%s) - T1))s"
if [ "$rc" -eq 5 ]; then
  tb_log "FAILED: pytest collected no bed tests; tests/bed must hold them"
  rc=1
fi
failures() {
  grep -E '^(E  |FAILED |ERROR |_{5,} )|Error:|Exception:' "$PYTEST_OUT" | cut -c1-400 | tail -n 80 >&2
}
if [ "$rc" -ne 0 ]; then
  # The failures both before and after the component log tails: a CI report may show only a slice.
  printf '\n===== the failures (full report above) =====\n' >&2
  failures
  tail_logs 25
  printf '\n===== the failures again =====\n' >&2
  failures
fi
exit "$rc"
