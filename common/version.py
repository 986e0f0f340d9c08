"""ringserve's version, read once from the installed package's metadata.

pyproject.toml's `[project] version` is the one place the version is written. The server
metadata (HTTP and gRPC), the OpenAPI document, `ringserve --version`, the build-info metric
and the trace resource all name `VERSION`.
"""

from __future__ import annotations

import importlib.metadata

DISTRIBUTION = "ringserve"
# A checkout imported without being installed has no metadata: say so instead of guessing a
# number. Still a valid PEP 440 version, so a client that parses the field does not choke on it.
UNKNOWN_VERSION = "0+unknown"


def installed_version(distribution: str = DISTRIBUTION) -> str:
    """The installed version of `distribution`, or UNKNOWN_VERSION when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


VERSION = installed_version()
