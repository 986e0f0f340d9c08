"""The `make test-systemd` kit, checked where it cannot run: the default suite is neither root nor
allowed minutes for a container. The kit itself (realsd.sh, sdtest.sh) runs the real systemd."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
SCRIPTS = sorted(HERE.glob("*.sh"))
SKIPPED = 77  # realsd.sh's exit status when this machine cannot run it


def readme_install() -> list[str]:
    out = subprocess.run([HERE / "readme-install.sh", REPO_ROOT / "docs" / "manual.md"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_the_kit_scripts_parse(script: Path) -> None:
    result = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_readme_block_the_kit_runs_installs_the_units_and_starts_them() -> None:
    lines = readme_install()
    assert lines[0].startswith("useradd --system") and "ringserve" in lines[0]
    assert any(line.startswith("install -m644 systemd/ringserve.service systemd/ringserve.socket /etc/systemd/system/") for line in lines)
    assert any(line.startswith("install -Dm644 systemd/ringserve.env /etc/ringserve/ringserve.env") for line in lines)
    # It stops at the start: reload and stop are what sdtest.sh checks, not part of the install.
    assert "systemctl enable --now ringserve.socket ringserve.service" in lines[-1]


def test_every_file_the_readme_block_installs_is_in_the_checkout() -> None:
    sources = [word for line in readme_install() if line.startswith("install ")
               for word in line.split("#")[0].split()[2:-1]]
    assert sources, "no `install` line in the manual's block"
    assert [s for s in sources if not (REPO_ROOT / s).is_file()] == []


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv to drop it")
def test_without_root_it_skips_with_the_reason() -> None:
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    # The checkout may lie where the dropped user cannot enter (a root home, a 0700 mktemp dir, and
    # pytest's own tmp_path is 0700): it runs a copy of the script from a directory it can read.
    with tempfile.TemporaryDirectory(prefix="ringserve-kit-") as where:
        os.chmod(where, 0o755)
        script = Path(where) / "realsd.sh"
        shutil.copy2(HERE / "realsd.sh", script)
        os.chmod(script, 0o755)
        result = subprocess.run([*drop, script], capture_output=True, text=True, timeout=30, cwd=where,
                                env={**os.environ, "ROOT": str(Path(where) / "root")})
    assert (result.returncode, result.stdout.strip()) == (SKIPPED, "SKIP test-systemd: needs root (debootstrap, systemd-nspawn)")


def test_ci_runs_the_readme_test_command_then_the_systemd_kit() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "make test" in commands
    kit = [i for i, line in enumerate(commands) if "tests/systemd/realsd.sh" in line]
    assert kit and kit[0] > commands.index("make test")
