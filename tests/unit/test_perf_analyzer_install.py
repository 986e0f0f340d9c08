"""bench/perf_analyzer.py: where perf_analyzer cannot be had, it says why and exits 77 (SKIPPED);
what it runs is trixie's loader on the wheel's binary, with trixie's libraries for it alone."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import perf_analyzer


def test_without_apt_it_exits_77_saying_it_needs_debian(monkeypatch, tmp_path: Path, capsys):
    monkeypatch.setattr(perf_analyzer, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(perf_analyzer.shutil, "which", lambda tool: None)

    assert perf_analyzer.main(["-m", "mlp"]) == perf_analyzer.SKIPPED

    said = capsys.readouterr().err
    assert said.startswith("SKIP perf_analyzer: not a Debian machine (no apt-get, dpkg-deb)")
    assert not (tmp_path / "done").exists()


def test_an_unreachable_index_is_a_skip_naming_the_step(monkeypatch, tmp_path: Path):
    def offline(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 1, "", "ERROR: Could not find a version that satisfies the "
                                                         "requirement perf-analyzer==2.60.0\n")

    monkeypatch.setattr(perf_analyzer.subprocess, "run", offline)
    with pytest.raises(perf_analyzer.CannotInstall, match=r"pip download perf-analyzer==2\.60\.0 failed \(exit 1\)"):
        perf_analyzer.command(tmp_path)
    assert list(tmp_path.iterdir()) == [tmp_path / ".lock"]  # nothing half-installed is left to be reused


def test_a_finished_install_is_run_through_its_own_loader_and_libraries(tmp_path: Path):
    (tmp_path / "done").write_text("installed\n")

    prefix = perf_analyzer.command(tmp_path)

    libs = tmp_path / "root/usr/lib/x86_64-linux-gnu"
    assert prefix == [str(libs / "ld-linux-x86-64.so.2"), "--library-path", str(libs), str(tmp_path / "perf_analyzer")]
