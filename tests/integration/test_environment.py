"""A bad environment gets one clear refusal at start, never a crash loop."""
from __future__ import annotations

import json
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


SMALL_SHM_SERVE = Path(__file__).resolve().parents[1] / "support" / "small_shm_serve.py"


@pytest.fixture(scope="module")
def cli_demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo models as a user gets them: `ringserve demo-models DIR`."""
    repo = tmp_path_factory.mktemp("demo-models")
    subprocess.run([sys.executable, "-P", "-m", "ringserve.cli", "demo-models", str(repo)], check=True,
                   capture_output=True)
    return repo


@pytest.mark.parametrize(("gateways", "ring"), [(1, [3, 16 * 2**20]), (2, [2, 16 * 2**20 - 65 * 4096])])
def test_dockers_default_64_mib_dev_shm_serves_with_the_rings_cut_to_fit(cli_demo_repo: Path, gateways: int,
                                                                         ring: list[int]) -> None:
    """Docker's default /dev/shm (64 MiB) under the default rings (8 slots of 16 MiB each): the server
    used to stop at once with exit 5. Now it starts with fewer (or smaller) slots and says so; it becomes
    ready, infers, gets a killed gateway back (its new ring is made once the old one is unlinked, and waits
    while a worker still maps that), and stops with exit 0 leaving nothing in /dev/shm. One gateway as the
    image runs it (3 slots of 16 MiB), and two (a ring each, 31.5 MiB: 2 slots of 15.75 MiB less a page)."""
    done = in_small_shm(64, [sys.executable, str(SMALL_SHM_SERVE), str(cli_demo_repo), "--gateways", str(gateways)])
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"rings": [ring] * gateways, "infer": 200, "infer_after_gateway_restart": 200, "stop_exit": 0}
    slots = ring[0]
    rings = "ring of the 1 gateway" if gateways == 1 else "rings of the 2 gateways"
    assert (f"/dev/shm has 64 MiB free: the {rings} cut from 8 slots of 16 MiB to {slots} slots of "
            in done.stderr), done.stderr[-3000:]
    assert f"--shm-size={128 * gateways + 1}m" in done.stderr and "--slot-count/--slot-mb" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_dev_shm_without_room_for_one_slot_of_the_largest_model_stops_the_server_with_what_it_needs(
        cli_demo_repo: Path) -> None:
    """The one refusal left: mlp's full batch (64 rows of 512 + 10 FP32) needs 131 KiB (a 132 KiB slot
    and the ring's header page: 136 KiB); a 128 KiB /dev/shm cannot hold it."""
    done = in_small_shm(0.125, [sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository",
                                str(cli_demo_repo), "--port", str(free_port()), "--grpc-port", "0", "--gateways", "1"])
    assert done.returncode == EXIT_NO_SHARED_MEMORY, done.stderr[-3000:]
    assert ("/dev/shm has 128 KiB free; one slot of the largest model needs 131 KiB, so 1 gateway ring of one "
            "slot need at least 136 KiB: give /dev/shm more (docker run --shm-size=, or the tmpfs mount's size=; the "
            "configured rings need 128.004 MiB), or fewer --gateways") in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "started gateway" not in done.stderr


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
