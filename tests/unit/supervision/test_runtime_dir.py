"""supervision/startup.py: prepare_runtime_dir and the directories above it (the serve-level refusals,
exit 6, are in tests/integration/test_environment.py)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from ringserve.common.settings import Settings
from ringserve.supervision.startup import RuntimeDirError, prepare_runtime_dir, temporary_dir_problem, unsafe_parents


def test_a_runtime_dir_under_a_sticky_world_writable_dir_like_tmp_is_accepted(tmp_path: Path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)

    assert prepare_runtime_dir(str(sticky / "run")) == str(sticky / "run")
    assert (sticky / "run").stat().st_mode & 0o777 == 0o700


def test_a_symlink_in_the_path_is_judged_where_it_lies_and_where_it_points(tmp_path: Path):
    private, open_dir = tmp_path / "private", tmp_path / "open"
    private.mkdir(mode=0o700)
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (private / "link").symlink_to(open_dir)  # the link's own dir is safe, its target's is not
    (open_dir / "link").symlink_to(private)  # and the other way round

    for path in (private / "link" / "run", open_dir / "link" / "run"):
        problem = unsafe_parents(str(path))
        assert problem is not None and f"{open_dir}, is writable by its group or by everyone" in problem, path
        with pytest.raises(RuntimeDirError):
            prepare_runtime_dir(str(path))
    assert not (private / "run").exists()


def test_directories_the_flag_makes_are_checked_once_made(tmp_path: Path):
    """makedirs gives the directories above the runtime dir the umask's mode: 0777 under umask 0."""
    mask = os.umask(0)
    try:
        with pytest.raises(RuntimeDirError, match="new, is writable by its group or by everyone \\(mode 777\\)"):
            prepare_runtime_dir(str(tmp_path / "new" / "run"))
    finally:
        os.umask(mask)


def test_a_runtime_dir_in_private_directories_is_accepted(tmp_path: Path):
    assert unsafe_parents(str(tmp_path / "a" / "run")) is None
    assert prepare_runtime_dir(str(tmp_path / "a" / "run")) == str(tmp_path / "a" / "run")


def test_without_a_writable_temporary_directory_the_problem_names_tmp_and_runtime_dir(monkeypatch):
    def no_usable(*_args: object) -> str:
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp', '/var/tmp', '/usr/tmp', '/']")

    assert temporary_dir_problem(Settings(model_repository="m")) is None  # this machine has one
    monkeypatch.setattr(tempfile, "gettempdir", no_usable)
    problem = temporary_dir_problem(Settings(model_repository="m"))
    assert problem is not None and "/tmp" in problem and "--runtime-dir" in problem and "--tmpfs /tmp" in problem
    assert "listen" not in problem and "port" not in problem
    assert temporary_dir_problem(Settings(model_repository="m", runtime_dir="/somewhere")) is None  # not needed
