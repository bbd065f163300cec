#!/usr/bin/env bash
# `make image`: build the operator image from the Dockerfile without a Docker engine or a registry.
#
# - podman (Debian's, with the runc runtime: crun refuses some hosts' hybrid cgroups) builds it;
# - the base is made here from Debian packages (mmdebstrap minbase bookworm with python3, venv and
#   pip), imported with `podman import`, and passed as the Dockerfile's PYTHON_IMAGE build argument;
#   with Docker and a registry, `docker build .` uses the pinned python:3.11 base instead, unchanged;
# - the tag is the package's version (pyproject.toml): IMAGE_REPOSITORY:VERSION;
# - the base rootfs is cached in ~/.cache/kvscale/image (KVSCALE_CACHE), the layers in podman's store.
#
# Environment: IMAGE_REPOSITORY (default ghcr.io/kvscale/kvscale-operator), IMAGE_TAG (default: the
# version), KVSCALE_IMAGE_FROM (a base image to use instead of building one, e.g. python:3.11-slim).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${KVSCALE_CACHE:-$HOME/.cache/kvscale}/image
REPOSITORY=${IMAGE_REPOSITORY:-ghcr.io/kvscale/kvscale-operator}
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
TAG=${IMAGE_TAG:-$VERSION}
BASE_IMAGE=localhost/kvscale-base:bookworm
BASE_PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

need=()
for tool in podman runc mmdebstrap; do command -v "$tool" >/dev/null || need+=("$tool"); done
if ((${#need[@]})); then
  [ "$(id -u)" = 0 ] || { log "missing ${need[*]}: install them (apt-get install podman runc mmdebstrap)"; exit 1; }
  log "installing ${need[*]} from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc mmdebstrap >/dev/null
fi
# Explicit ulimits below the current ones: podman otherwise asks for more than such hosts allow.
PODMAN=(podman --runtime runc)
LIMITS=(--ulimit "nofile=$(ulimit -n):$(ulimit -n)" --ulimit "nproc=4096:4096")

base=${KVSCALE_IMAGE_FROM:-}
if [ -z "$base" ]; then
  base=$BASE_IMAGE
  if ! "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
    mkdir -p "$CACHE"
    rootfs=$CACHE/base-bookworm.tar
    if [ ! -s "$rootfs" ]; then
      log "making the base rootfs with mmdebstrap (minbase bookworm + $BASE_PACKAGES)"
      # mmdebstrap picks the output format from the name's extension: keep .tar on the partial file.
      mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" bookworm "$CACHE/partial.tar"
      mv "$CACHE/partial.tar" "$rootfs"
    fi
    "${PODMAN[@]}" import --quiet "$rootfs" "$BASE_IMAGE" >/dev/null
  fi
fi

# A TLS-intercepting proxy between this machine and PyPI (its CA is in the host's bundle, not the
# base's): mount the host's bundle into the build only; the image never contains it.
build_ca=()
ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [ -n "$ca" ] && [ -s "$ca" ]; then
  build_ca=(--volume "$ca:/run/build-ca.crt:ro" --build-arg PIP_CERT=/run/build-ca.crt)
fi

log "building $REPOSITORY:$TAG from $base"
"${PODMAN[@]}" build --quiet --network host "${LIMITS[@]}" "${build_ca[@]}" \
  --build-arg "PYTHON_IMAGE=$base" --build-arg "VERSION=$VERSION" \
  --tag "$REPOSITORY:$TAG" . >/dev/null
size=$("${PODMAN[@]}" image inspect "$REPOSITORY:$TAG" --format '{{.Size}}')
log "built $REPOSITORY:$TAG ($((size / 1000000)) MB)"
echo "$REPOSITORY:$TAG"
