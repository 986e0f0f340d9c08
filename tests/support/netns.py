"""Run Triton's example clients unchanged: they talk to localhost:8000 (HTTP) and localhost:8001 (gRPC).

Those ports may be taken on a shared machine, and the scripts must not be edited, so the server
and the clients run in a network namespace of their own (an unprivileged user namespace with a
new network namespace, `unshare -rn`), where 8000 and 8001 are free and loopback is brought up
here. The test process calls `run_clients`; inside the namespace `python -m tests.support.netns` starts
the stack on 8000/8001, runs each client script in its own folder, stops the stack (it must
leave nothing behind) and prints one JSON line: each client's exit status and output.

    python -m tests.support.netns <repository> <client dir> <script> [<client dir> <script> ...] -- [serve flags]
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


class NoNamespace(RuntimeError):
    """This machine does not let an unprivileged process make a network namespace."""


def run_clients(repo: Path, clients: list[tuple[Path, str]], serve_flags: list[str], timeout_s: float = 240
                ) -> list[dict]:
    """[{"script", "returncode", "output"}] of each client, run against ringserve serving `repo`."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise NoNamespace("no unshare(1) on this machine")
    probe = subprocess.run([unshare, "-rn", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise NoNamespace(f"unshare -rn is refused here: {probe.stderr.strip()}")
    args = [str(repo)] + [part for folder, script in clients for part in (str(folder), script)]
    run = subprocess.run([unshare, "-rn", sys.executable, "-m", "tests.support.netns", *args, "--", *serve_flags],
                         cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        raise AssertionError(f"the namespace runner exited {run.returncode}:\n{run.stdout}\n{run.stderr[-6000:]}")
    return json.loads(lines[-1])["clients"]


def loopback_up() -> None:
    """`ip link set lo up`, without needing iproute2: SIOCSIFFLAGS on lo."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


def main(argv: list[str]) -> int:
    from .stack import Stack

    split = argv.index("--")
    repo, pairs, flags = Path(argv[0]), argv[1:split], argv[split + 1:]
    loopback_up()
    stack = Stack(repo, "--grpc-port", "8001", *flags)
    stack.port, stack.url = 8000, "http://127.0.0.1:8000"
    results = []
    try:
        stack.start(ready_timeout_s=120)
        for folder, script in zip(pairs[::2], pairs[1::2]):
            run = subprocess.run([sys.executable, script], cwd=folder, capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "PYTHONPATH": ""})
            results.append({"script": f"{Path(folder).name}/{script}", "returncode": run.returncode,
                            "output": run.stdout + run.stderr})
    finally:
        try:
            stack.stop()
        finally:
            stack.kill_everything()
        stack.assert_nothing_left()
    print(json.dumps({"clients": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
