#!/usr/bin/env bash
# `make test-container`: the CPU image (Dockerfile) built and run for real (tests/container/test_image.py):
# ready with Docker's default 64 MiB /dev/shm, an inference checked against ONNX Runtime here, a worker
# killed inside the container under load with no request lost, `docker stop` draining to exit 0, and
# --read-only with and without a tmpfs on /tmp. It prints the image's size and its start-to-ready time.
#
#   sudo tests/container/run.sh
#   env: PY=.venv/bin/python (pytest, tritonclient)  OUT=build/container  KEEP_IMAGES=1 (keep the base image
#        and the built one for the next run)  MIRROR=<a Debian archive> (default: this machine's apt sources')
# The base is Debian bookworm's own python3 (3.11), debootstrap-ed and imported: no registry image is
# pulled (none may be reachable), and `--build-arg PYTHON_IMAGE=` takes it as it would python:3.11-slim.
# pip inside the build reaches PyPI on the host's network, trusting the machine's own local CAs
# (/usr/local/share/ca-certificates, passed as PIP_CA_PEM) where it has any.
# Needs root and a Docker engine: where none runs it installs Debian's docker.io and starts dockerd for
# the run. Exit status: 0 passed, 1 a check (or the build) failed, 77 skipped: this machine cannot run
# it (not root, no engine, no Debian mirror), with the reason printed.
set -euo pipefail
SKIPPED=77
skip() { echo "SKIP test-container: $*"; exit $SKIPPED; }
[ "$(id -u)" = 0 ] || skip "needs root (a Docker engine, debootstrap)"
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
OUT=$(mkdir -p "${OUT:-$REPO/build/container}" && cd "${OUT:-$REPO/build/container}" && pwd)
BASE_IMAGE=ringserve-base:bookworm
IMAGE=ringserve:test-container
T0=$(date +%s)
log() { echo "[test-container +$(( $(date +%s) - T0 ))s] $*"; }
die() { echo "FAIL test-container: $*"; exit 1; }

# 0. a Docker engine: the one running, or Debian's started for this run (and stopped after it)
started_dockerd=""
cleanup() {
    if [ -z "${KEEP_IMAGES:-}" ]; then docker image rm -f "$IMAGE" >/dev/null 2>&1 || true; fi
    if [ -n "$started_dockerd" ]; then kill "$started_dockerd" 2>/dev/null || true; wait "$started_dockerd" 2>/dev/null || true; fi
}
trap cleanup EXIT
if ! docker info >/dev/null 2>&1; then
    if ! command -v dockerd >/dev/null; then
        log "installing docker.io"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io; } \
            > "$OUT/apt.log" 2>&1 || skip "apt-get install docker.io failed: $(tail -1 "$OUT/apt.log")"
    fi
    if ! docker info >/dev/null 2>&1; then
        log "starting dockerd"
        dockerd > "$OUT/dockerd.log" 2>&1 &
        started_dockerd=$!
        for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
        docker info >/dev/null 2>&1 || skip "dockerd does not start here: $(tail -2 "$OUT/dockerd.log")"
    fi
fi

# 1. the base image: Debian's python3, debootstrap-ed
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap \
        > "$OUT/apt.log" 2>&1 || skip "apt-get install debootstrap failed"; }
    MIRROR=${MIRROR:-$(cd "$REPO" && "$PY" -m bench.debian_mirror)} || skip "no Debian archive in this machine's apt sources; set MIRROR"
    log "debootstrap bookworm from $MIRROR (python3, venv, ca-certificates)"
    rootfs=$OUT/rootfs
    rm -rf --one-file-system "$rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
        bookworm "$rootfs" "$MIRROR" > "$OUT/debootstrap.log" 2>&1 || die "debootstrap: $(tail -3 "$OUT/debootstrap.log")"
    # what python:3.11-slim leaves out too: apt's lists and caches, docs, man pages, locales
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
        "$rootfs"/usr/share/doc/* \
        "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
    # the image's own apt-get (procps) reads the same archive
    echo "deb $MIRROR bookworm main" > "$rootfs/etc/apt/sources.list"
    tar -C "$rootfs" -c . | docker import -c 'CMD ["/bin/bash"]' - "$BASE_IMAGE" > /dev/null
    rm -rf --one-file-system "$rootfs"
fi

# 2. the image, from this checkout
log "docker build (Dockerfile, base $BASE_IMAGE)"
ca=""
for pem in /usr/local/share/ca-certificates/*.crt; do [ -f "$pem" ] && ca+="$(cat "$pem")"$'\n'; done
DOCKER_BUILDKIT=0 docker build --network host -t "$IMAGE" --build-arg PYTHON_IMAGE="$BASE_IMAGE" \
    --build-arg PIP_CA_PEM="$ca" "$REPO" > "$OUT/build.log" 2>&1 || die "docker build: $(tail -5 "$OUT/build.log")"

# 3. the checks
log "running tests/container"
cd "$REPO"
RINGSERVE_IMAGE="$IMAGE" "$PY" -m pytest tests/container -v -s -p no:cacheprovider
log "passed"
