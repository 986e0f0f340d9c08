"""No package registry's host name in the project's files; what needs a mirror reads the machine's own.

bench/debian_mirror.py reads apt's sources (one-line .list and deb822 .sources) for the Debian archive
that bench/perf_analyzer.py and tests/systemd/realsd.sh fetch from."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bench.debian_mirror import APT_DIR, NoDebianMirror, debian_mirror, source_uris

REPO = Path(__file__).resolve().parents[2]

DEB822 = """\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://sources.example/debian
Suites: bookworm

Types: deb
URIs: http://disabled.example/debian
Enabled: no
Suites: bookworm

Types: deb
URIs: https://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
"""


def apt_dir(tmp_path: Path, sources_list: str = "", parts: dict[str, str] | None = None) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(sources_list)
    for name, text in (parts or {}).items():
        (tmp_path / "sources.list.d" / name).write_text(text)
    return tmp_path


def test_the_debian_archive_is_read_from_deb822_sources_skipping_security_source_and_disabled_stanzas(
        tmp_path: Path) -> None:
    assert debian_mirror(apt_dir(tmp_path, parts={"debian.sources": DEB822})) == "https://mirror.example/debian"


def test_one_line_sources_come_first_and_their_options_are_no_uri(tmp_path: Path) -> None:
    directory = apt_dir(tmp_path, "# deb http://commented.example/debian bookworm main\n"
                                  "deb [arch=amd64 signed-by=/k.gpg] http://proxy.example:3142/debian bookworm main\n",
                        {"debian.sources": DEB822, "z.list": "deb http://later.example/debian bookworm main\n"})
    assert list(source_uris(directory)) == ["http://proxy.example:3142/debian", "http://mirror.example/debian-security",
                                            "https://mirror.example/debian/", "http://later.example/debian"]
    assert debian_mirror(directory) == "http://proxy.example:3142/debian"


def test_apt_sources_without_a_debian_archive_say_so(tmp_path: Path) -> None:
    with pytest.raises(NoDebianMirror, match="no Debian archive"):
        debian_mirror(apt_dir(tmp_path, "deb http://ppa.example/ubuntu jammy main\n"))


def registry_hosts() -> set[str]:
    """The package registries' hosts this machine is configured with: apt's sources, pip's index URLs."""
    urls = list(source_uris(APT_DIR)) if APT_DIR.is_dir() else []
    pip = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    for line in pip.stdout.splitlines():
        if re.search(r"index-url\s*=", line):
            urls += line.split("=", 1)[1].strip().strip("'\"").split()
    urls += os.environ.get("PIP_INDEX_URL", "").split() + os.environ.get("PIP_EXTRA_INDEX_URL", "").split()
    return {host for url in urls if (host := urlsplit(url).hostname) and "." in host}


def test_no_file_of_the_project_names_a_package_registrys_host() -> None:
    """Code that needs a mirror derives it at run time (bench/debian_mirror.py): a host written into the
    project is wrong behind another mirror or proxy, and names a place the project does not decide."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: `git grep` has no files to search")
    hosts = registry_hosts()
    if not hosts:
        pytest.skip("this machine's apt sources and pip configuration name no registry host")
    found = {}
    for host in sorted(hosts):
        grep = subprocess.run(["git", "grep", "-n", "-I", "-F", host, "--", "."], cwd=REPO, capture_output=True,
                              text=True)
        if grep.stdout:
            found[host] = grep.stdout.splitlines()[:5]
    assert found == {}
