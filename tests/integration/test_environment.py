"""A bad environment gets one clear refusal at start, never a crash loop."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import free_port
from ..unit.shm.test_ring import in_small_shm

pytestmark = pytest.mark.integration

EXIT_NO_SHARED_MEMORY = 5
EXIT_BAD_RUNTIME_DIR = 6


def test_a_dev_shm_too_small_for_the_ring_stops_the_server_at_once_with_the_sizes_and_the_flags(
        demo_repo: Path) -> None:
    """Docker's default /dev/shm (64 MiB) under the default ring (8 slots of 16 MiB): the gateway used
    to die of SIGBUS at its first write into the ring, again and again."""
    done = in_small_shm(64, [sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository",
                             str(demo_repo), "--port", str(free_port()), "--grpc-port", "0"])
    assert done.returncode == EXIT_NO_SHARED_MEMORY, done.stderr[-3000:]
    assert ("cannot reserve 128 MiB of shared memory for the ring: /dev/shm has 64 MiB free of 64 MiB. Ask for "
            "less with --slot-count (now 8) or --slot-mb (now 16)") in done.stderr
    assert "Traceback" not in done.stderr and "started gateway" not in done.stderr


def test_a_ring_that_fits_a_small_dev_shm_serves(demo_repo: Path) -> None:
    """3 slots of 16 MiB (48 MiB) in 64 MiB. --gateways 1: each gateway has a ring of its own, and the
    default (0, auto: one per 4 CPUs) gives 2 on a host with 8 or more CPUs, 96 MiB, refused there."""
    port = free_port()
    script = ("import subprocess, sys, time, urllib.request\n"
              f"p = subprocess.Popen([sys.executable, '-P', '-m', 'ringserve.cli', 'serve', '--model-repository', "
              f"{str(demo_repo)!r}, '--port', '{port}', '--grpc-port', '0', '--gateways', '1', "
              f"'--slot-count', '3', '--slot-mb', '16'])\n"
              "try:\n"
              "    for _ in range(600):\n"
              "        if p.poll() is not None:\n"
              "            sys.exit(f'exited with {p.returncode} before it was ready')\n"
              "        try:\n"
              "            urllib.request.urlopen(sys.argv[1], timeout=1); break\n"
              "        except OSError:\n"
              "            time.sleep(0.1)\n"
              "    else:\n"
              "        sys.exit('never ready')\n"
              "finally:\n"
              "    if p.poll() is None:\n"
              "        p.terminate()\n"
              "    rc = p.wait(60)\n"
              "sys.exit(rc)\n")
    done = in_small_shm(64, [sys.executable, "-c", script, f"http://127.0.0.1:{port}/v2/health/ready"])
    assert done.returncode == 0, done.stderr[-3000:]


# Modes that let another user write into the directory: everyone (777), its group (770), and write without
# read or search (720, 702), which is still enough to replace a socket file whose name one knows.
OPEN_MODES = {"world_writable": 0o777, "group_writable": 0o770, "group_write_only": 0o720,
              "other_write_only": 0o702}


@pytest.mark.parametrize("case", ["someone_elses", *OPEN_MODES, "uncreatable"])
def test_a_runtime_dir_the_server_cannot_trust_is_refused_with_a_message(demo_repo: Path, tmp_path: Path,
                                                                         case: str) -> None:
    path = tmp_path / "run"
    if case == "uncreatable":
        blocker = tmp_path / "file"
        blocker.write_text("")
        path = blocker / "run"  # under a regular file: cannot be made
    else:
        path.mkdir(mode=0o700)
        if case in OPEN_MODES:
            path.chmod(OPEN_MODES[case])
        elif os.geteuid() == 0:
            os.chown(path, 65534, 65534)
        else:
            pytest.skip("needs root to give the directory to another user")
    done = subprocess.run([sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository", str(demo_repo),
                           "--port", str(free_port()), "--grpc-port", "0", "--runtime-dir", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_BAD_RUNTIME_DIR, done.stderr[-3000:]
    if case in OPEN_MODES:
        expected = f"is writable by its group or by everyone (mode {OPEN_MODES[case]:o})"
    else:
        expected = {"someone_elses": "is owned by uid 65534, not by the server's user",
                    "uncreatable": "cannot be created or read (Not a directory)"}[case]
    assert f"--runtime-dir {path}: {expected}" in done.stderr
    assert "Traceback" not in done.stderr and "started gateway" not in done.stderr
    assert not list(path.iterdir()) if path.is_dir() else True


# A parent (or any directory above) that another user may write: they could rename the runtime dir
# away and put their own in its place, sockets and all. Sticky ones (/tmp) let only an entry's owner do that.
PARENT_CASES = {"parent_world_writable": (0o777, "is writable by its group or by everyone (mode 777) and not sticky"),
                "parent_group_writable": (0o770, "is writable by its group or by everyone (mode 770) and not sticky"),
                "grandparent_world_writable": (0o777, "is writable by its group or by everyone (mode 777) and not "
                                                      "sticky"),
                "parent_someone_elses": (0o755, "is owned by uid 65534, not by the server's user or root")}


@pytest.mark.parametrize("case", PARENT_CASES)
def test_a_runtime_dir_whose_parent_another_user_may_write_is_refused(demo_repo: Path, tmp_path: Path,
                                                                      case: str) -> None:
    mode, expected = PARENT_CASES[case]
    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    open_dir.chmod(mode)
    path = open_dir / ("below" if case.startswith("grandparent") else "") / "run"
    if case.startswith("grandparent"):
        path.parent.mkdir(mode=0o700)
    if case == "parent_someone_elses":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the directory to another user")
        os.chown(open_dir, 65534, 65534)
    done = subprocess.run([sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository", str(demo_repo),
                           "--port", str(free_port()), "--grpc-port", "0", "--runtime-dir", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_BAD_RUNTIME_DIR, done.stderr[-3000:]
    assert f"--runtime-dir {path}: a directory above it, {open_dir}, {expected}: another local user could move " \
           "the runtime dir aside and put their own in its place" in done.stderr
    assert "Traceback" not in done.stderr and "started gateway" not in done.stderr
    assert not path.exists()  # refused before anything was made
