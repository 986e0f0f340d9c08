"""Triton's benchmark client, perf_analyzer, on this machine: installed when missing, then run.

    python -m bench.perf_analyzer -m mlp -u localhost:8000 [any perf_analyzer flag ...]
    python -m bench.perf_analyzer --install     (install only; prints the command it would run)

`run_closed_loop` runs it as a bench suite's load generator (bench/protocols.py): one closed-loop
run at a concurrency, its report parsed into the suites' LoadResult.

PyPI's `perf-analyzer` 2.60 is a wheel for manylinux_2_38 (glibc 2.38, libstdc++ of GCC 13+);
Debian 12 has glibc 2.36. So the binary runs with Debian 13's (trixie's) C and C++ runtimes,
unpacked into a private directory and used by that binary alone: it is started through trixie's
dynamic loader, `ld-linux-x86-64.so.2 --library-path <trixie libs> perf_analyzer ARGS`, and
nothing else on the machine sees those libraries (no LD_LIBRARY_PATH, no change to the system's
apt sources: `apt-get download` runs with a private configuration and state under build/).

Everything lands in build/perf_analyzer/ (gitignored): the wheel's binary, the .debs and what
they unpack to. A finished install is reused; installs in parallel wait for each other (a lock).
Exit status 77 (SKIPPED) with the reason on stderr when this machine cannot have it: not Linux
x86-64, not Debian (no apt-get/dpkg-deb, no Debian archive in its apt sources), PyPI or that
archive not reachable (the machine's own mirror: bench/debian_mirror.py), or the binary
still cannot start. Otherwise perf_analyzer's own exit status.
"""
from __future__ import annotations

import fcntl
import math
import os
import platform
import pwd
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.debian_mirror import NoDebianMirror, debian_mirror

VERSION = "2.60.0"
SKIPPED = 77
SUITE = "trixie"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# The runtimes the binary links (`ld.so --list`: libc, libm, libstdc++, libgcc_s, libz, libssl,
# libcrypto, and libzstd that libcrypto links), all from trixie so that they match each other;
# trixie's OpenSSL 3 is libssl3t64.
PACKAGES = ("libc6", "libstdc++6", "libgcc-s1", "zlib1g", "libssl3t64", "libzstd1")
BUILD_DIR = Path(__file__).resolve().parent.parent / "build" / "perf_analyzer"
BINARY = "perf_analyzer"
LIBDIR = "root/usr/lib/x86_64-linux-gnu"
STEP_TIMEOUT_S = 300


class CannotInstall(Exception):
    """perf_analyzer cannot be had on this machine; the message says why."""


def command(build_dir: Path | None = None) -> list[str]:
    """The argv prefix that runs perf_analyzer (install first when missing; CannotInstall says why not)."""
    build_dir = BUILD_DIR if build_dir is None else build_dir
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (another install in progress: wait for it, then reuse it)
        if not (build_dir / "done").exists():
            _install(build_dir)
    libdir = build_dir / LIBDIR
    return [str(libdir / "ld-linux-x86-64.so.2"), "--library-path", str(libdir), str(build_dir / BINARY)]


def _install(build_dir: Path) -> None:
    if sys.platform != "linux" or platform.machine() != "x86_64":
        raise CannotInstall(f"perf_analyzer's wheel is for Linux x86-64; this is {sys.platform} {platform.machine()}")
    missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    if missing or not Path(KEYRING).exists():
        raise CannotInstall(f"not a Debian machine (no {', '.join(missing) or KEYRING}): the C runtime it needs "
                            "comes from Debian's packages")
    with tempfile.TemporaryDirectory(dir=build_dir) as scratch:
        work = Path(scratch)
        _download_binary(work)
        _download_runtimes(work)
        _check_runs(work)
        for name in (BINARY, "root"):
            target = build_dir / name
            if target.exists():
                shutil.rmtree(target) if target.is_dir() else target.unlink()
            (work / name).rename(target)
    (build_dir / "done").write_text(f"perf_analyzer {VERSION} with Debian {SUITE}'s {' '.join(PACKAGES)}\n")


def _run(argv: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, **kwargs)
    except subprocess.TimeoutExpired:
        raise CannotInstall(f"{what}: no answer within {STEP_TIMEOUT_S} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        raise CannotInstall(f"{what} failed (exit {done.returncode}): {' | '.join(last)}")
    return done


def _download_binary(work: Path) -> None:
    """The wheel, for its platform (pip would refuse it for this one), and the binary out of it."""
    wheels = work / "wheel"
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform",
          "manylinux_2_38_x86_64", "--python-version", "3", "--implementation", "py", "--abi", "none",
          "-d", str(wheels), f"perf-analyzer=={VERSION}"], f"pip download perf-analyzer=={VERSION}")
    (wheel,) = wheels.glob("perf_analyzer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (work / BINARY).write_bytes(archive.read(f"perf_analyzer/bin/{BINARY}"))
    (work / BINARY).chmod(0o755)


def _download_runtimes(work: Path) -> None:
    """trixie's packages through a private apt (its own sources, lists and cache), unpacked with dpkg-deb."""
    apt = work / "apt"
    for part in ("sources.list.d", "preferences.d", "lists/partial", "archives/partial"):
        (apt / part).mkdir(parents=True)
    try:
        mirror = debian_mirror()  # the machine's own: the project names no registry
    except NoDebianMirror as exc:
        raise CannotInstall(f"{exc}: the C runtime perf_analyzer needs comes from Debian's packages") from None
    (apt / "sources.list").write_text(f"deb [signed-by={KEYRING}] {mirror} {SUITE} main\n")
    user = pwd.getpwuid(os.getuid()).pw_name  # (apt's sandbox user: root's _apt could not write here)
    (apt / "apt.conf").write_text("\n".join([
        f'Dir::Etc::sourcelist "{apt}/sources.list";', f'Dir::Etc::sourceparts "{apt}/sources.list.d";',
        f'Dir::Etc::preferences "{apt}/preferences";', f'Dir::Etc::preferencesparts "{apt}/preferences.d";',
        f'Dir::State "{apt}";', f'Dir::State::lists "{apt}/lists";', 'Dir::State::status "/dev/null";',
        f'Dir::Cache "{apt}";', f'Dir::Cache::archives "{apt}/archives";', 'Acquire::Languages "none";',
        'APT::Architecture "amd64";', f'APT::Sandbox::User "{user}";', ""]))
    env = {**os.environ, "APT_CONFIG": str(apt / "apt.conf")}
    _run(["apt-get", "update", "-q"], f"apt-get update from {mirror} {SUITE}", env=env)
    debs = work / "debs"
    debs.mkdir()
    _run(["apt-get", "download", "-q", *PACKAGES], f"apt-get download {' '.join(PACKAGES)}", env=env, cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(work / "root")], f"dpkg-deb -x {deb.name}")


def _check_runs(work: Path) -> None:
    libdir = work / LIBDIR
    loader = [str(libdir / "ld-linux-x86-64.so.2"), "--library-path", str(libdir)]
    listed = _run([*loader, "--list", str(work / BINARY)], "ld.so --list perf_analyzer").stdout
    missing = [line.strip() for line in listed.splitlines() if "not found" in line]
    if missing:
        raise CannotInstall(f"perf_analyzer needs libraries the packages {' '.join(PACKAGES)} lack: {missing}")
    _run([*loader, str(work / BINARY), "--version"], "perf_analyzer --version")


# -- as a load generator --------------------------------------------------------------------
# perf_analyzer's report, as 2.60 prints it (`Client:` then `Server:`); times in µs.
_REPORT = {
    "client_requests": r"Client:\s*\n\s*Request count: (\d+)",
    "throughput": r"Throughput: ([\d.]+) infer/sec",
    "p50_us": r"p50 latency: (\d+) usec", "p90_us": r"p90 latency: (\d+) usec", "p99_us": r"p99 latency: (\d+) usec",
    "mean_us": r"Avg (?:gRPC time|HTTP time|latency): (\d+) usec",
    "inferences": r"Inference count: (\d+)", "executions": r"Execution count: (\d+)",
}
TRIALS = 3  # perf_analyzer's stability check needs 3 windows; 1000 % lets any 3 pass


def parse_report(text: str) -> dict[str, float]:
    """The numbers of one concurrency's report; KeyError names the one it lacks."""
    found: dict[str, float] = {}
    for key, pattern in _REPORT.items():
        match = re.search(pattern, text)
        if match is None:
            raise KeyError(f"perf_analyzer's report has no {key} ({pattern})")
        found[key] = float(match.group(1))
    return found


def run_closed_loop(target: str, model: str, protocol: Sequence[str], *, concurrency: int, duration_s: float,
                    warmup_s: float, window: Any = None, request_timeout_s: float = 30.0,
                    served: Callable[[], int] | None = None) -> Any:
    """perf_analyzer at `concurrency` against `target`: TRIALS windows of duration_s / TRIALS each (so
    the measured time is the suite's duration; its first window is its warm-up, `warmup_s` is unused).
    `protocol` is its protocol flags (`-i grpc --streaming`, `--input-tensor-format json`, ...).
    Server CPU per request needs the requests served while `window` measured: `served()` (the model's
    success count in the statistics) before and after; without it, perf_analyzer's own count."""
    from bench.load import LoadResult, NoWindow  # noqa: PLC0415 - `python -m bench.perf_analyzer` needs none of it

    window = window or NoWindow()
    interval_ms = max(200, int(duration_s * 1000 / TRIALS))
    argv = [*command(), "-m", model, "-u", target, *protocol, "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-interval", str(interval_ms), "--stability-percentage", "1000",
            "--max-trials", str(TRIALS), "--percentile", "99"]
    timeout_s = TRIALS * interval_ms / 1000 * 4 + request_timeout_s + 30
    before = served() if served else 0
    window.start()
    wall0, cpu0 = time.perf_counter(), _children_cpu_s()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        output, failure = done.stdout, None if done.returncode == 0 else f"exit {done.returncode}"
    except subprocess.TimeoutExpired as exc:
        output, failure = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or "", \
            f"no report within {timeout_s:.0f} s"
        done = None
    wall_s, cpu_s = time.perf_counter() - wall0, _children_cpu_s() - cpu0
    window.end()
    after = served() if served else 0
    try:
        report = parse_report(output) if failure is None else None
    except KeyError as exc:
        report, failure = None, str(exc)
    if report is None:
        stderr = done.stderr if done is not None else ""
        tail = " | ".join((stderr.strip() or output.strip()).splitlines()[-3:])
        return LoadResult(generator="perf_analyzer", mode="closed", clients=concurrency, window_s=wall_s,
                          requests=0, rps=math.nan, p50_ms=math.nan, p90_ms=math.nan, p99_ms=math.nan,
                          mean_ms=math.nan, max_ms=math.nan, cdf=[], errors=1,
                          errors_by_kind={"perf_analyzer": 1}, error_samples=[f"{failure}: {tail}"],
                          gen_cpu_s=cpu_s, gen_cpu_pct=cpu_s / wall_s * 100.0)
    requests = after - before if served else int(report["client_requests"])
    return LoadResult(
        generator="perf_analyzer", mode="closed", clients=concurrency, window_s=wall_s, requests=requests,
        rps=report["throughput"], p50_ms=report["p50_us"] / 1000, p90_ms=report["p90_us"] / 1000,
        p99_ms=report["p99_us"] / 1000, mean_ms=report["mean_us"] / 1000, max_ms=math.nan,
        cdf=[[50, report["p50_us"] / 1000], [90, report["p90_us"] / 1000], [99, report["p99_us"] / 1000]],
        errors=0, errors_by_kind={}, error_samples=[], gen_cpu_s=cpu_s, gen_cpu_pct=cpu_s / wall_s * 100.0,
    )


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    try:
        prefix = command()
    except CannotInstall as exc:
        print(f"SKIP perf_analyzer: {exc}", file=sys.stderr)
        return SKIPPED
    if argv[:1] == ["--install"]:
        print(" ".join(prefix))
        return 0
    os.execv(prefix[0], [*prefix, *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
