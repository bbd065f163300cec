# syntax=docker/dockerfile:1
# The kvscale operator image: ghcr.io/kvscale/kvscale-operator:0.1.0 (helm/kvscale values.image).
#   docker build -t ghcr.io/kvscale/kvscale-operator:0.1.0 .
#   make image    (no Docker engine or registry: podman and a Debian base built here; image/build.sh)
# Two stages: build a wheel of the package and install it into a virtualenv, then copy only that
# virtualenv onto a clean base. It runs as the non-root user 65532 and execs `kvscale run` directly
# (no shell); the chart adds a read-only root filesystem with an emptyDir at /tmp.
# Pinned base (same tag in both stages, so the venv's python symlink resolves in the runtime stage).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Only where the build machine reaches PyPI through a TLS-intercepting proxy: the CA bundle to trust,
# mounted into the build (`make image` does this); unset otherwise. Never part of the image.
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel needs (.dockerignore keeps the context to these too).
COPY pyproject.toml README.md ./
COPY operator/ ./operator/
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/kvscale \
 && /opt/kvscale/bin/pip install /wheels/kvscale-*.whl \
 && /opt/kvscale/bin/pip uninstall --yes pip setuptools \
 && /opt/kvscale/bin/kvscale run --help >/dev/null

FROM ${PYTHON_IMAGE}
# The package's version (pyproject.toml), which `make image` passes and the image tag repeats.
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="kvscale-operator" \
      org.opencontainers.image.description="kvscale: SLO-driven capacity planning and autoscaling for LLM serving on Kubernetes" \
      org.opencontainers.image.source="https://github.com/kvscale/kvscale" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# A named user for uid/gid 65532 (kopf and getpass look the user up); no home, no login shell.
RUN groupadd --system --gid 65532 kvscale \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kvscale
COPY --from=build /opt/kvscale /opt/kvscale
ENV PATH=/opt/kvscale/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
USER 65532:65532
WORKDIR /tmp
# 8080: kopf's /healthz (--liveness); 8081: the operator's /metrics (--metrics-port).
EXPOSE 8080 8081
ENTRYPOINT ["kvscale", "run"]
CMD ["--liveness=http://0.0.0.0:8080/healthz", "--metrics-port=8081"]
