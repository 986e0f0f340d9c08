"""The Debian mirror this machine's apt uses, read from its own sources at run time.

    python -m bench.debian_mirror        prints it (tests/systemd/realsd.sh); exit 1 where there is none

The project names no package registry's host: what needs Debian's packages (bench/perf_analyzer.py's
private apt, realsd.sh's debootstrap) takes the archive the machine is already configured with, so
that it works behind the same mirror or proxy as the machine's own `apt-get`. The archive is the
first source whose path ends in `/debian` (not `/debian-security`, not a PPA), in apt's order:
/etc/apt/sources.list, then /etc/apt/sources.list.d/*.list and *.sources by name.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

APT_DIR = Path("/etc/apt")


class NoDebianMirror(Exception):
    """This machine's apt sources name no Debian archive."""


def debian_mirror(apt_dir: Path = APT_DIR) -> str:
    """The URI of the machine's Debian archive (`http://host/debian`, no trailing slash)."""
    for uri in source_uris(apt_dir):
        if uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    raise NoDebianMirror(f"no Debian archive (a URI ending in /debian) in {apt_dir}/sources.list or "
                         f"{apt_dir}/sources.list.d/")


def source_uris(apt_dir: Path = APT_DIR) -> Iterator[str]:
    """Every URI of the enabled `deb` sources, in apt's order (one-line .list and deb822 .sources)."""
    files = [apt_dir / "sources.list"]
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        yield from (_deb822_uris(text) if path.suffix == ".sources" else _one_line_uris(text))


def _one_line_uris(text: str) -> Iterator[str]:
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()  # ([options] go)
        if len(words) >= 2 and words[0] == "deb":
            yield words[1]


def _deb822_uris(text: str) -> Iterator[str]:
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
            yield from fields.get("uris", "").split()


def main() -> int:
    try:
        print(debian_mirror())
    except NoDebianMirror as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
