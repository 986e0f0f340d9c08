"""Fixtures of the protocol suites: one repository with every kind of tensor, served per module."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.protocol_models import build_protocol_repo
from tests.support.stack import running_stack


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_protocol_repo(tmp_path_factory.mktemp("protocol-models"))


@pytest.fixture(scope="module")
def stack(repo: Path):
    with running_stack(repo) as s:
        yield s
