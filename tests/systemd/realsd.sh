#!/usr/bin/env bash
# `make test-systemd`: ringserve under a REAL systemd. Boots a Debian container whose PID 1 is
# systemd (systemd-nspawn -b on a debootstrap-ed root, both from Debian's packages), installs
# ringserve and the units from this checkout exactly as docs/manual.md "Running under systemd" says, runs
# tests/systemd/sdtest.sh inside (readiness, STATUS=, socket activation, reload under load, a
# worker's SIGSEGV, the watchdog, stop and drain, hardening), then powers the container off.
#
#   sudo tests/systemd/realsd.sh
#   env: KEEP_ROOTFS=1   keep the debootstrap-ed root and pip's cache for the next run (saves ~2 min;
#                        each run still starts from the pristine root: an overlay takes its changes)
#        ROOT=build/systemd (the repository's ignored build dir)  SUITE=bookworm
#        MIRROR=<a Debian archive> (default: the one this machine's apt sources name)  NSPAWN_OPTS="..."
# Needs root, the Debian mirror (the packages systemd-container and debootstrap, then debootstrap)
# and PyPI (pip inside the container, on the host's network during the install step only; the
# booted container has --private-network: loopback only).
# Exit status: 0 every check passed, 1 a check (or the install) failed, 77 skipped: this machine
# cannot run it (not root, no Debian mirror, the packages do not install, nspawn cannot boot).
set -euo pipefail
SKIPPED=77
skip() { echo "SKIP test-systemd: $*"; exit $SKIPPED; }
[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, systemd-nspawn)"
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROOT=$(mkdir -p "${ROOT:-$REPO/build/systemd}" && cd "${ROOT:-$REPO/build/systemd}" && pwd)
BASE=$ROOT/base           # debootstrap's output, never booted: reused with KEEP_ROOTFS=1
RF=$ROOT/rootfs           # what the container boots: an overlay of BASE, changes in $ROOT/upper
LOGS=$ROOT/logs
M=ringserve-sdtest
SUITE=${SUITE:-bookworm}
# The machine's own Debian archive (bench/debian_mirror.py): the project names no registry's host.
MIRROR=${MIRROR:-$(cd "$REPO" && python3 -m bench.debian_mirror)} || skip "no Debian archive in this machine's apt sources; set MIRROR"
PATHS=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
T0=$(date +%s)
log() { echo "[test-systemd +$(( $(date +%s) - T0 ))s] $*"; }
die() { echo "FAIL test-systemd: $*"; exit 1; }

mkdir -p "$LOGS"; rm -f "$LOGS"/*

# 0. tools, from Debian's packages
if ! command -v systemd-nspawn >/dev/null || ! command -v debootstrap >/dev/null; then
    log "installing systemd-container debootstrap"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd-container debootstrap; } \
        > "$LOGS/apt.log" 2>&1 || skip "apt-get install systemd-container debootstrap failed: $(tail -1 "$LOGS/apt.log")"
fi

# debootstrap and nspawn mount file systems: root in an unprivileged container cannot
probe=$(mktemp -d)
if mount -t tmpfs sdtest-probe "$probe" 2>/dev/null; then umount "$probe"; rmdir "$probe"
else rmdir "$probe"; skip "root here cannot mount file systems (an unprivileged container?)"; fi

# 1. the root file system
[ -e "$BASE/.partial" ] && rm -rf --one-file-system "$BASE"     # an interrupted debootstrap
if [ ! -x "$BASE/usr/lib/systemd/systemd" ]; then
    python3 - "$MIRROR/dists/$SUITE/Release" <<'EOF' || skip "the Debian mirror $MIRROR does not answer"
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=30).read(1)
EOF
    log "debootstrap $SUITE from $MIRROR"
    mkdir -p "$BASE"; touch "$BASE/.partial"
    debootstrap --variant=minbase \
        --include=systemd,systemd-sysv,dbus,python3,python3-venv,curl,ca-certificates,procps,iproute2 \
        "$SUITE" "$BASE" "$MIRROR" > "$LOGS/debootstrap.log" 2>&1 || die "debootstrap: $(tail -3 "$LOGS/debootstrap.log")"
    echo "$M" > "$BASE/etc/hostname"; rm -f "$BASE/.partial"
fi
# Every run boots a fresh copy: the manual's `useradd` and `install` must find a system without them.
# An overlay of BASE takes this run's changes; a plain copy where overlayfs cannot (ROOT itself on
# overlayfs, as in a Docker container).
mountpoint -q "$RF" && umount "$RF"
rm -rf --one-file-system "$RF" "$ROOT/upper" "$ROOT/work"; mkdir -p "$RF" "$ROOT/upper" "$ROOT/work"
if ! mount -t overlay overlay -o "lowerdir=$BASE,upperdir=$ROOT/upper,workdir=$ROOT/work" "$RF" 2>/dev/null; then
    log "no overlayfs on $ROOT: copying $BASE"
    cp -a "$BASE/." "$RF/" || die "cannot copy $BASE to $RF"
fi

NS=(-D "$RF" -M "$M")
# Without systemd on the host (PID 1 is not systemd in CI containers) there is no machined and no
# system bus: nspawn must neither register the machine nor ask for a scope unit.
[ -d /run/systemd/system ] || NS+=(--register=no --keep-unit)
# A pure cgroup v2 tree in the container, and bpf() let through nspawn's seccomp filter: systemd
# enforces DevicePolicy= with a BPF program on the unit's cgroup. (nspawn's default on a cgroup v1
# host is a hybrid tree whose device controller is read-only: DevicePolicy= silently does nothing.)
export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1
BOOT_OPTS=(--system-call-filter=bpf)

NSPAWN=""
cleanup() {
    set +e
    if [ -n "$NSPAWN" ] && kill -0 "$NSPAWN" 2>/dev/null; then
        log "powering the container off"
        [ -n "${LEADER:-}" ] && kill -RTMIN+4 "$LEADER" 2>/dev/null      # systemd: poweroff
        for _ in $(seq 1 150); do kill -0 "$NSPAWN" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$NSPAWN" 2>/dev/null && { log "nspawn still up: SIGTERM"; kill -TERM "$NSPAWN"; sleep 5; }
        kill -0 "$NSPAWN" 2>/dev/null && { log "nspawn still up: SIGKILL"; kill -KILL "$NSPAWN"; }
        wait "$NSPAWN" 2>/dev/null
    fi
    # nspawn leaves this where /run is not a tmpfs
    [ -d "/run/systemd/nspawn/propagate/$M" ] && rm -rf --one-file-system "/run/systemd/nspawn/propagate/$M"
    mountpoint -q "$RF" && umount "$RF"
    mountpoint -q "$RF" || rm -rf --one-file-system "$RF"
    rm -rf --one-file-system "$ROOT/upper" "$ROOT/work" "$ROOT/src"
    if [ "${KEEP_ROOTFS:-0}" = 1 ]; then log "kept $BASE and $ROOT/pip-cache (KEEP_ROOTFS=1)"
    else rm -rf --one-file-system "$BASE" "$ROOT/pip-cache"; fi
    log "logs in $LOGS"
}
trap cleanup EXIT

# 2. this checkout (tracked and untracked files, not the ignored ones) into /opt/ringserve/.venv,
# the demo models and a slow model (the drain check) into /var/lib/ringserve/models, as the manual
# assumes. A one-shot container, not booted, on the host's network for PyPI. pip reaches PyPI
# through whatever CA the host trusts (a TLS proxy's, in some CI): the host's bundle is bound in.
git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1 || die "$REPO is not a git checkout: the kit installs its tracked and untracked files"
rm -rf "$ROOT/src"; mkdir -p "$ROOT/src" "$ROOT/pip-cache"
git -C "$REPO" ls-files -z --cached --others --exclude-standard \
    | (cd "$REPO" && tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$ROOT/src"
HOSTCA=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
log "pip install . into the container's /opt/ringserve/.venv (the working tree of $(git -C "$REPO" log --oneline -1 | cut -c1-50))"
timeout 900 systemd-nspawn "${NS[@]}" -q --as-pid2 --pipe --bind="$ROOT/src:/src" \
    --bind="$ROOT/pip-cache:/root/.cache/pip" \
    --bind-ro="$HOSTCA:/run/host-ca.crt" --setenv=PIP_CERT=/run/host-ca.crt /bin/sh -ec '
    python3 -m venv /opt/ringserve/.venv
    /opt/ringserve/.venv/bin/pip install -q --disable-pip-version-check /src
    /opt/ringserve/.venv/bin/ringserve demo-models /var/lib/ringserve/models
    /opt/ringserve/.venv/bin/python -c "from pathlib import Path; from ringserve.common.repository.demo import build_slow_model
build_slow_model(Path(\"/var/lib/ringserve/models/slow\"), width=1024, layers=1024)"' \
    > "$LOGS/install.log" 2>&1 || die "installing ringserve in the container: $(tail -5 "$LOGS/install.log")"

# 3. boot: systemd as PID 1, loopback-only network, the checkout and the checks read-only
log "booting the container"
setsid systemd-nspawn "${NS[@]}" "${BOOT_OPTS[@]}" ${NSPAWN_OPTS:-} -b --private-network --console=passive \
    --bind-ro="$ROOT/src:/src" --bind-ro="$HERE:/sdtest" > "$LOGS/nspawn.log" 2>&1 &
NSPAWN=$!
# The container's PID 1 as the host sees it: the child of nspawn that runs systemd in a new PID
# namespace (nspawn's first child is a short-lived helper in ours).
LEADER=""
for _ in $(seq 1 300); do
    for p in $(ps -o pid= --ppid "$NSPAWN" || true); do
        [ "$(readlink /proc/$p/ns/pid)" != "$(readlink /proc/self/ns/pid)" ] && [ "$(cat /proc/$p/comm 2>/dev/null)" = systemd ] && LEADER=$p
    done
    [ -n "$LEADER" ] && break; kill -0 "$NSPAWN" 2>/dev/null || break; sleep 0.1
done
[ -n "$LEADER" ] || skip "systemd-nspawn -b did not start systemd in a container: $(tail -3 "$LOGS/nspawn.log")"
# Commands in the container: nsenter, since without machined there is no `machinectl shell`.
cx() { nsenter -t "$LEADER" -a -- env -i PATH=$PATHS LANG=C.UTF-8 SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"; }
state=$(timeout 120 nsenter -t "$LEADER" -a -- env -i PATH=$PATHS \
        sh -c 'until [ -S /run/systemd/private ]; do sleep 0.2; done; systemctl is-system-running --wait' 2>&1 || true)
case "$state" in
    running|degraded) log "container PID 1: $(cx cat /proc/1/comm), $(cx systemctl --version | head -1), $(cx stat -fc %T /sys/fs/cgroup), state $state";;
    *) skip "systemd-nspawn -b did not boot to a running system (state '$state'): $(tail -3 "$LOGS/nspawn.log")";;
esac

# 4. docs/manual.md "Running under systemd", verbatim: its block up to `systemctl ... enable --now`
readme_install=$("$HERE/readme-install.sh" "$REPO/docs/manual.md")
for cmd in useradd 'install -m644 systemd/ringserve.service systemd/ringserve.socket' 'enable --now'; do
    grep -qF -- "$cmd" <<< "$readme_install" || die "docs/manual.md's 'Running under systemd' block has no '$cmd' line: $readme_install"
done
log "installing the units as docs/manual.md says:"; sed 's/^/    /' <<< "$readme_install"
cx timeout 360 bash -ec "cd /src; $readme_install" > "$LOGS/readme-install.log" 2>&1 \
    || { cx journalctl -b --no-pager > "$LOGS/journal.txt" 2>&1; die "the README's commands failed: $(tail -5 "$LOGS/readme-install.log")"; }
cx systemd-analyze verify /etc/systemd/system/ringserve.service /etc/systemd/system/ringserve.socket \
    > "$LOGS/verify.log" 2>&1 || die "systemd-analyze verify: $(cat "$LOGS/verify.log")"

# 5. the checks
log "running tests/systemd/sdtest.sh in the container"
set +e
cx timeout 600 bash /sdtest/sdtest.sh 2>&1 | tee "$LOGS/results.txt"
failed=${PIPESTATUS[0]}
cx journalctl -b --no-pager > "$LOGS/journal.txt" 2>&1
set -e
log "$(grep -c '^PASS' "$LOGS/results.txt") passed, $failed failed (journal: $LOGS/journal.txt)"
[ "$failed" = 0 ] || exit 1
