"""`python -m bench python --quick`, for real: the Python model and the ONNX model measured side by side.

Structure only, never speed: the machine is shared and has 2 CPUs.
"""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.bench_quick import run_quick

pytestmark = pytest.mark.integration

LEVELS = (1, 4)  # the suite's --quick concurrency


def test_the_python_model_and_the_onnx_model_are_measured_side_by_side_and_stop_clean(tmp_path: Path):
    doc = run_quick("python", tmp_path)

    assert doc["suite"] == "python" and doc["settings"]["quick"] is True
    closed = {(r["case"], r["clients"]): r for r in doc["summary"] if r["mode"] == "closed"}
    assert set(closed) == {(c, n) for c in ("onnx", "python") for n in LEVELS}
    for key, row in closed.items():
        assert row["rps"] > 0 and row["errors"] == 0 and row["server_cpu_us_per_request"] > 0, key
    assert [r["clients"] for r in doc["side_by_side"]] == list(LEVELS)
    assert all(r["python_overhead_cpu_us"] is not None for r in doc["side_by_side"])
    assert "Python path CPU µs/req" in (tmp_path / "python.md").read_text()
    for service in doc["services"].values():
        stop = service["stop"]
        assert stop["returncode"] in (0, -signal.SIGTERM) and not stop["forced"] and not stop["removed_leftovers"]
