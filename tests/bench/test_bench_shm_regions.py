"""`python -m bench shm --quick`, for real: both sizes, both modes, every answer checked by the suite.

Structure only, never speed: the machine is shared and has 2 CPUs.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench_quick import run_quick

pytestmark = pytest.mark.integration


def test_the_shm_suite_measures_binary_and_shm_at_1_and_16_mib_and_leaves_no_segment(tmp_path):
    before = {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("bench-")}
    doc = run_quick("shm", tmp_path)
    assert doc["suite"] == "shm" and doc["settings"]["quick"] is True
    rows = {(r["size_mib"], r["mode"]): r for r in doc["summary"]}
    assert set(rows) == {(1, "binary"), (1, "shm"), (16, "binary"), (16, "shm")}
    for key, row in rows.items():
        assert row["requests"] == 3 and row["p90_ms"] >= row["p50_ms"] > 0, key
    assert rows[(1, "binary")]["speedup"] == 1.0
    assert "| 16 MiB | shm |" in (tmp_path / "shm.md").read_text()
    assert {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("bench-")} == before
