# cache-router: the proxy as a container image.
#
#   docker build -t cache-router .
#   docker run -p 8080:8080 -e CACHE_ROUTER_WORKERS="http://w0:8000 http://w1:8000" cache-router
#   docker run -p 8080:8080 -v ./router.yaml:/etc/cache-router/config.yaml:ro cache-router
#
# Two stages: `build` installs the locked runtime set (requirements/runtime.lock) and the
# project into /opt/venv with deploy/install.sh (the same
# script `make image-steps` runs in CI, where no Docker engine is available); the final stage
# is the slim Python base plus that venv, run as an unprivileged user. Compose and Kubernetes
# manifests that use this image: deploy/.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is built from (see .dockerignore).
COPY pyproject.toml README.md ./
COPY router/ router/
COPY policies/ policies/
COPY traces/ traces/
COPY requirements/runtime.lock requirements/runtime.lock
COPY deploy/install.sh deploy/check_lock.py deploy/
RUN sh deploy/install.sh /opt/venv /src

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="cache-router" \
      org.opencontainers.image.description="Cache-aware request router for LLM inference (vLLM / SGLang workers)" \
      org.opencontainers.image.licenses="Apache-2.0"
# redis-server: `serve --processes N` without --state-url starts a private one on a unix socket
# (router/service/supervisor.py); with --state-url it is not used.
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server=5:7.0.* \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 cache-router \
    && useradd --system --uid 10001 --gid cache-router --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin cache-router
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/config.yaml /etc/cache-router/config.yaml
COPY deploy/docker/healthcheck.py /opt/cache-router/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    CACHE_ROUTER_HOST=0.0.0.0
USER 10001:10001
EXPOSE 8080
# Liveness: the router answers /health (200, or 503 while no worker is healthy yet).
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "/opt/cache-router/healthcheck.py"]
# Options: flags after the image name replace CMD; CACHE_ROUTER_* variables; or the YAML file.
ENTRYPOINT ["cache-router", "serve"]
CMD ["--config", "/etc/cache-router/config.yaml"]
