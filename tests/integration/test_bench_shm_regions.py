"""`python -m bench shm --quick`, for real: both sizes, both modes, every answer checked by the suite.

Structure only, never speed: the machine is shared and has 2 CPUs.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_shm_suite_measures_binary_and_shm_at_1_and_16_mib_and_leaves_no_segment(tmp_path):
    before = {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("bench-")}
    process = subprocess.Popen([sys.executable, "-m", "bench", "shm", "--quick", "--out-dir", str(tmp_path)],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=150)
    finally:
        if process.poll() is None:  # SIGTERM: the bench then stops its server
            process.send_signal(signal.SIGTERM)
            output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output[-4000:]

    doc = json.loads((tmp_path / "shm.json").read_text())
    assert doc["suite"] == "shm" and doc["settings"]["quick"] is True
    rows = {(r["size_mib"], r["mode"]): r for r in doc["summary"]}
    assert set(rows) == {(1, "binary"), (1, "shm"), (16, "binary"), (16, "shm")}
    for key, row in rows.items():
        assert row["requests"] == 3 and row["p90_ms"] >= row["p50_ms"] > 0, key
    assert rows[(1, "binary")]["speedup"] == 1.0
    assert "| 16 MiB | shm |" in (tmp_path / "shm.md").read_text()
    assert {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("bench-")} == before
