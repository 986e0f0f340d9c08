"""common/version.py: the version is written once (pyproject.toml) and read from the package metadata
by everything that names it: the server metadata (HTTP and gRPC), OpenAPI, `--version`, build info."""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringserve.common import version
from ringserve.gateway.observe.process_metrics import BuildInfoCollector
from ringserve.gateway.http.openapi import openapi_document
from ringserve.gateway.http.routes import SERVER_METADATA

# In a fresh interpreter: every place that names the version, as JSON.
REPORT = """
import contextlib, io, json
from ringserve import cli
from ringserve.gateway.observe.process_metrics import BuildInfoCollector
from ringserve.gateway.http.openapi import openapi_document
from ringserve.gateway.http.routes import SERVER_METADATA
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
    cli.main(["--version"])
print(json.dumps({"server metadata": SERVER_METADATA["version"], "openapi": openapi_document()["info"]["version"],
                  "build info": BuildInfoCollector().labels[0], "--version": out.getvalue().split()[-1]}))
"""


def test_the_server_metadata_version_is_the_package_metadata_version(tmp_path: Path) -> None:
    installed = importlib.metadata.version("ringserve")
    assert SERVER_METADATA["version"] == openapi_document()["info"]["version"] == installed
    assert BuildInfoCollector().labels[0] == installed
    # Read, not written twice: a distribution found ahead of the installed one on sys.path, as if
    # pyproject.toml said 9.8.7, changes every place at once.
    dist_info = tmp_path / "ringserve-9.8.7.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: ringserve\nVersion: 9.8.7\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", REPORT], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == dict.fromkeys(["server metadata", "openapi", "build info", "--version"], "9.8.7")


def test_a_checkout_that_was_never_installed_says_its_version_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert version.installed_version() == version.UNKNOWN_VERSION == "0+unknown"
