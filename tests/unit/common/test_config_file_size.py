"""A model config file is read up to MAX_CONFIG_BYTES: a larger one refuses its model unread, saying so
(a 9 MB config.pbtxt took a reloaded worker past its start timeout while it parsed)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ringserve.common.repository.demo import build_demo_models
from ringserve.common.repository.pbtxt import MAX_CONFIG_BYTES
from ringserve.common.repository.scan import scan_repository


@pytest.mark.parametrize("name", ["config.pbtxt", "config.json"])
def test_a_config_file_over_the_limit_is_refused_without_parsing_it(tmp_path: Path, name):
    build_demo_models(tmp_path)
    (tmp_path / "mlp" / "config.json").unlink()
    (tmp_path / "mlp" / name).write_text(" " * (MAX_CONFIG_BYTES + 1))

    scan = scan_repository(tmp_path)

    assert "mlp" not in scan.versions and "encoder" in scan.versions
    assert f"{tmp_path / 'mlp' / name} is {MAX_CONFIG_BYTES + 1} bytes; a model config may have at most " \
           f"{MAX_CONFIG_BYTES} bytes" in scan.failed["mlp"]


def test_a_config_pbtxt_at_the_limit_is_read(tmp_path: Path):
    build_demo_models(tmp_path)
    (tmp_path / "mlp" / "config.json").unlink()
    (tmp_path / "mlp" / "config.pbtxt").write_text('name: "mlp"\n'.ljust(MAX_CONFIG_BYTES))

    assert "mlp" in scan_repository(tmp_path).versions
