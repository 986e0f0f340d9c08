# ringserve on CPU:   docker build -t ringserve:latest .
#   docker run --rm --shm-size=256m -p 8000:8000 -p 8001:8001 -p 8002:8002 ringserve:latest
# It serves the demo models (mlp, encoder) built into /models; mount your own repository there
# (-v /path/to/repo:/models:ro) or pass --model-repository DIR (the last one given wins), and any
# other `ringserve serve` flag after the image name. The CUDA variant is Dockerfile.cuda.
#
# /dev/shm: each gateway's ring of batch slots lives there: gateways x --slot-count x --slot-mb,
# plus a 4 KiB header page each (here 1 x 8 x 16 MiB = 128 MiB: the image passes --gateways 1,
# since a container sees every CPU of its host and the default, one gateway per 4 CPUs, would
# size the rings by the host). Docker gives a container 64 MiB: run with --shm-size (256m here);
# without it the server cuts the rings to fit (3 slots of 16 MiB) and a warning says so and how
# much the configured rings need. Kubernetes: an
# emptyDir with medium Memory mounted at /dev/shm (deploy/kubernetes/).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- builder: ringserve and its dependencies into a virtualenv, from this checkout ----------------
# The CPU image swaps onnxruntime-gpu (pyproject's dependency) for the CPU build of the same release:
# the same `onnxruntime` module without the 271 MB CUDA provider it could never load here (Dockerfile.cuda
# keeps it). The image is ~430 MB on python:3.11-slim instead of ~700.
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/ringserve/.venv
# Where no registry is reachable, or behind a proxy with its own CA (nothing here names a registry):
#   --build-arg PIP_INDEX=https://mirror.example/simple  (and PIP_EXTRA_INDEX, PIP_TRUSTED_HOST)
#   --build-arg PIP_CA_PEM="$(cat corp-ca.pem)"  (a CA bundle pip trusts, PEM text: public, and used
#   by this build stage only). No `# syntax=` line: it made BuildKit fetch a frontend image.
ARG PIP_INDEX="" PIP_EXTRA_INDEX="" PIP_TRUSTED_HOST="" PIP_CA_PEM=""
WORKDIR /src
# The package is the repository root (pyproject.toml's package-dir), with the otel extra so that
# --otel-endpoint works in the image; .dockerignore keeps the
# tests, benchmarks, virtualenvs and models out.
COPY . .
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# As pip's own environment variables, so that the isolated environment pip builds the package in (its
# build dependencies: setuptools) reaches the same index through the same CA; options on the command
# line do not reach it.
RUN if [ -n "$PIP_CA_PEM" ]; then printf '%s\n' "$PIP_CA_PEM" > /tmp/pip-ca.pem; export PIP_CERT=/tmp/pip-ca.pem; fi; \
    if [ -n "$PIP_INDEX" ]; then export PIP_INDEX_URL="$PIP_INDEX"; fi; \
    if [ -n "$PIP_EXTRA_INDEX" ]; then export PIP_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX"; fi; \
    if [ -z "$PIP_TRUSTED_HOST" ]; then unset PIP_TRUSTED_HOST; fi; \
    /opt/ringserve/.venv/bin/pip install --no-cache-dir -c constraints.txt '.[otel]' \
    && ort=$(/opt/ringserve/.venv/bin/python -c 'import importlib.metadata as m; print(m.version("onnxruntime-gpu"))') \
    && /opt/ringserve/.venv/bin/pip uninstall -y -q onnxruntime-gpu \
    && /opt/ringserve/.venv/bin/pip install --no-cache-dir "onnxruntime==$ort" \
    && rm -f /tmp/pip-ca.pem \
    && /opt/ringserve/.venv/bin/ringserve --version

# -- runtime: slim Python, the virtualenv, the demo models, a user of its own ---------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="ringserve" \
      org.opencontainers.image.description="KServe v2 model server that batches on the server and survives native crashes of its ONNX Runtime workers"
# The same base image as the builder's: the venv's python is a link to its /usr/local/bin/python3.
COPY --from=builder /opt/ringserve/.venv /opt/ringserve/.venv
# HOME: a writable one (ringserve's user has none), where ONNX Runtime keeps its telemetry id; without it each
# worker's start printed an ANSI-coloured warning that it could not.
ENV PATH=/opt/ringserve/.venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# ps, pgrep and kill for `docker exec` (Debian's procps, from the base's own release).
# hadolint ignore=DL3008
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends procps \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
# The demo models, built now (onnx.helper: nothing is downloaded), so the image serves as it is.
RUN ringserve demo-models /models \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin ringserve
# Not root; numeric, so that Kubernetes' runAsNonRoot can check it. The runtime dir goes in /tmp.
USER 10001:10001
# HTTP (KServe v2), gRPC (Triton's 8001), and /metrics on a port of its own (Triton's 8002).
EXPOSE 8000 8001 8002
# Healthy = ready: a worker serves the models. No curl in slim images: Python's urllib. The start
# period covers the workers' import of ONNX Runtime and the model loads. Keep it on --port.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request as u; sys.exit(0 if u.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4).status == 200 else 1)"]
# SIGTERM drains: accepted requests finish (--drain-timeout-s, 30 s): `docker stop -t 40`.
STOPSIGNAL SIGTERM
# --hold-when-unavailable-s 5 (the server's default is 0), as `make serve`: a container is often the only
# replica its clients reach, and a request that waits the few hundred ms a worker's replacement takes beats a
# 503 (with 0, a worker killed under load gave 8 of 429 requests a 503). Behind a balancer with several
# replicas, pass --hold-when-unavailable-s 0 after the image name (the last value given wins).
ENTRYPOINT ["ringserve", "serve", "--host", "0.0.0.0", "--model-repository", "/models", "--gateways", "1", "--metrics-port", "8002", "--hold-when-unavailable-s", "5"]
CMD []
