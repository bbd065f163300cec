#!/usr/bin/env bash
# Run a REAL vLLM OpenAI-compatible server (CPU build) on 127.0.0.1 for a tiny
# offline model.  Runs in the foreground (exec), so a caller can background it
# and stop it by PID:
#
#   tests/realvllm/serve.sh [MODEL_DIR] [PORT] [extra `vllm serve` args...]
#
#   MODEL_DIR  default ${KVSCALE_CACHE_DIR:-$HOME/.cache/kvscale}/tiny-llama;
#              built with tiny_model.py if it has no config.json
#   PORT       default 8000
#
# Environment knobs:
#   SERVED_MODEL_NAME       default tiny-llama
#   KVSCALE_VLLM_MFU=0      drop --enable-mfu-metrics (on by default)
#   MAX_MODEL_LEN           default 2048
#   MAX_NUM_SEQS            default 8
#   KV_CACHE_BYTES          if set: --kv-cache-memory-bytes, and VLLM_CPU_KVCACHE_SPACE
#                           is unset (that legacy env var silently overrides the
#                           flag on CPU).  The tiny model needs 512 B per token, so
#                           4194304 = 8192 tokens = 64 blocks of 128: small enough
#                           for vllm:kv_cache_usage_perc to move under load.
#   VLLM_CPU_KVCACHE_SPACE  KV cache size in GiB (integer), default 1, used when
#                           KV_CACHE_BYTES is not set.  With neither, vLLM CPU
#                           would size the KV cache to 92% of the machine's RAM.
#   KVSCALE_VLLM_VENV       use this venv instead of running install.sh
#
# Health: GET /health (200 when ready); metrics: GET /metrics.
# Useful extra args: --seed N; --custom-histogram-buckets '{"request_latency":
# [0.005,0.01,0.025,0.05,0.1,0.3,1,5,30]}' (the default e2e/queue/prefill/decode
# buckets start at 0.3 s, far above the tiny model's ~10-25 ms prefills).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_DIR="${KVSCALE_CACHE_DIR:-${HOME:-/tmp}/.cache/kvscale}"
MODEL_DIR="${1:-${CACHE_DIR}/tiny-llama}"
PORT="${2:-8000}"
shift $(( $# < 2 ? $# : 2 ))

VENV="${KVSCALE_VLLM_VENV:-$("${HERE}/install.sh" | tail -n 1)}"
PY="${VENV}/bin/python"

if [[ ! -f "${MODEL_DIR}/config.json" ]]; then
  echo "[realvllm/serve] building tiny model in ${MODEL_DIR}" >&2
  "${PY}" "${HERE}/tiny_model.py" "${MODEL_DIR}" >&2
fi

# Fully offline; CPU platform; no usage reporting.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_TARGET_DEVICE=cpu
if [[ -n "${KV_CACHE_BYTES:-}" ]]; then
  unset VLLM_CPU_KVCACHE_SPACE
else
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
fi
export VLLM_HOST_IP="${VLLM_HOST_IP:-127.0.0.1}"   # engine<->API message queues on loopback
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1

args=(
  serve "${MODEL_DIR}"
  --host 127.0.0.1
  --port "${PORT}"
  --served-model-name "${SERVED_MODEL_NAME:-tiny-llama}"
  --enforce-eager
  --max-model-len "${MAX_MODEL_LEN:-2048}"
  --max-num-seqs "${MAX_NUM_SEQS:-8}"
  --disable-uvicorn-access-log
  # NB: never pass --disable-log-stats: it turns the engine's Prometheus stats off.
)
if [[ -n "${KV_CACHE_BYTES:-}" ]]; then
  args+=(--kv-cache-memory-bytes "${KV_CACHE_BYTES}")
fi
if [[ "${KVSCALE_VLLM_MFU:-1}" != "0" ]]; then
  args+=(--enable-mfu-metrics)   # vllm:estimated_flops_per_gpu_total & friends
fi

exec "${VENV}/bin/vllm" "${args[@]}" "$@"
