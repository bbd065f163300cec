#!/usr/bin/env bash
# End-to-end smoke run of a REAL vLLM (CPU) server on 127.0.0.1:
# install (cached) -> tiny model (cached) -> serve -> wait for /health ->
# a bounded handful of /v1/completions -> /metrics summary -> stop.
#
#   tests/realvllm/smoke.sh [--save-metrics FILE] [probe.py args...]
#
# Environment: everything serve.sh honours (KVSCALE_CACHE_DIR, KVSCALE_VLLM_MFU,
# KV_CACHE_BYTES, SERVED_MODEL_NAME, ...), plus
#   PORT                 default: a free port picked at random
#   HEALTH_TIMEOUT_S     default 300
# The server runs in its own session/process group and is always stopped
# (SIGTERM, then SIGKILL after 30 s) when this script exits.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_DIR="${KVSCALE_CACHE_DIR:-${HOME:-/tmp}/.cache/kvscale}"
MODEL_DIR="${MODEL_DIR:-${CACHE_DIR}/tiny-llama}"
HEALTH_TIMEOUT_S="${HEALTH_TIMEOUT_S:-300}"

t0=$(date +%s.%N)
VENV="$("${HERE}/install.sh" | tail -n 1)"
export KVSCALE_VLLM_VENV="${VENV}"
echo "[smoke] venv ${VENV} ($(printf '%.1f' "$(echo "$(date +%s.%N) - ${t0}" | bc)") s)"

if [[ ! -f "${MODEL_DIR}/config.json" ]]; then
  "${VENV}/bin/python" "${HERE}/tiny_model.py" "${MODEL_DIR}" >/dev/null
fi

PORT="${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
LOG="$(mktemp -t realvllm-serve.XXXXXX.log)"

SERVER_PID=""
stop_server() {
  [[ -n "${SERVER_PID}" ]] || return 0
  if kill -0 "${SERVER_PID}" 2>/dev/null; then
    kill -TERM -- "-${SERVER_PID}" 2>/dev/null || true
    for _ in $(seq 1 60); do
      kill -0 -- "-${SERVER_PID}" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL -- "-${SERVER_PID}" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT INT TERM

t_start=$(date +%s.%N)
setsid "${HERE}/serve.sh" "${MODEL_DIR}" "${PORT}" >"${LOG}" 2>&1 &
SERVER_PID=$!

healthy=0
deadline=$(( $(date +%s) + HEALTH_TIMEOUT_S ))
while (( $(date +%s) < deadline )); do
  if curl -sf "http://127.0.0.1:${PORT}/health" >/dev/null 2>&1; then healthy=1; break; fi
  if ! kill -0 "${SERVER_PID}" 2>/dev/null; then break; fi
  sleep 0.25
done
if (( ! healthy )); then
  echo "[smoke] server did not become healthy; last log lines:" >&2
  tail -n 40 "${LOG}" >&2
  exit 1
fi
startup=$(echo "$(date +%s.%N) - ${t_start}" | bc)
echo "[smoke] healthy on 127.0.0.1:${PORT} after $(printf '%.1f' "${startup}") s (log ${LOG})"

python3 "${HERE}/probe.py" --base-url "http://127.0.0.1:${PORT}" \
  --model "${SERVED_MODEL_NAME:-tiny-llama}" "$@"

rss_kb=$(ps -o rss= --sid "${SERVER_PID}" | awk '{s += $1} END {print s + 0}')
echo "[smoke] server process group RSS: $(( rss_kb / 1024 )) MiB"
ps -o pid=,rss=,args= --sid "${SERVER_PID}" | awk '{printf "[smoke]   pid %s rss %d MiB %s\n", $1, $2/1024, $3}'

stop_server
echo "[smoke] stopped"
