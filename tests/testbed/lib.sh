# Shared by up.sh, down.sh and run-bed-tests.sh (sourced, not executed).
# shellcheck shell=bash
TESTBED_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$TESTBED_DIR/../.." && pwd)
# shellcheck source=versions.env
source "$TESTBED_DIR/versions.env"
CACHE=${KVSCALE_CACHE:-$HOME/.cache/kvscale}
BIN=$CACHE/testbed/bin
ST=$REPO_ROOT/.testbed            # the bed's state: kubeconfig, pids, logs, pki, data
PIDS=$ST/pids
LOGS=$ST/logs

tb_log() { printf '[testbed %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# running NAME -> whether the process recorded in pids/NAME.pid still runs (exists and is not a zombie). Unlike
# pid_of it does not check the binary: just after `start`, that process can still be the shell, setsid or env on
# its way to exec'ing the binary, which pid_of reads as gone (a cold CI run once failed so, at once:
# "lws-controller exited while waiting for: LeaderWorkerSet controller", its log showing it starting normally).
running() {
  local f=$PIDS/$1.pid pid state
  [ -s "$f" ] || return 1
  pid=$(head -n1 "$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# pid_of NAME -> prints the PID recorded in pids/NAME.pid if that process is alive AND is really
# the binary the file is named after (guards against a recycled PID). Returns 1 otherwise.
pid_of() {
  local f=$PIDS/$1.pid pid exe
  [ -s "$f" ] || return 1
  pid=$(head -n1 "$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  exe=$(basename "${exe% (deleted)}")
  # pid files are named after the binary, optionally with a suffix: llm-d-inference-sim-8123.pid
  [[ $1 == "$exe" || $1 == "$exe"-* ]] || return 1
  printf '%s\n' "$pid"
}

# Prints the last lines of the bed's component logs (for failures). The simulators' and the per-test
# operators' logs (dozens in a full run) are only listed: their tails would push a failure's own lines
# out of the slice of the output a CI report shows. They stay in $LOGS.
tail_logs() {
  local n=${1:-40} f skipped=()
  [ -d "$LOGS" ] || return 0
  for f in "$LOGS"/*.log; do
    [ -e "$f" ] || continue
    case $(basename "$f") in
      llm-d-inference-sim-*|kvscale-*) skipped+=("$(basename "$f")"); continue ;;
    esac
    printf '\n===== last %s lines of %s =====\n' "$n" "$f" >&2
    # kwok's per-node heartbeats dropped; long lines cut so the tails stay readable in a CI report
    grep -v '"msg":"Syncing lease"' "$f" | tail -n "$n" | cut -c1-300 >&2
  done
  if [ ${#skipped[@]} -gt 0 ]; then
    printf '\n===== %s simulator and per-test operator logs in %s, not shown =====\n' "${#skipped[@]}" "$LOGS" >&2
  fi
}
