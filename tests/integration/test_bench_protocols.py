"""`python -m bench protocols --quick`, for real: gRPC, HTTP JSON and HTTP binary each measured, side by side.

Structure only, never speed: the machine is shared and has 2 CPUs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
CASES = ("grpc", "http_json", "http_binary", "http_json_grpc_off")
LEVELS = (1, 4)  # the suite's --quick concurrency


def test_every_protocol_is_measured_side_by_side_and_the_server_stops_clean(tmp_path: Path):
    process = subprocess.Popen([sys.executable, "-m", "bench", "protocols", "--quick", "--out-dir", str(tmp_path)],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=150)
    finally:
        if process.poll() is None:  # SIGTERM: the bench then stops its server
            process.send_signal(signal.SIGTERM)
            output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output[-4000:]
    doc = json.loads((tmp_path / "protocols.json").read_text())
    assert doc["suite"] == "protocols" and doc["settings"]["quick"] is True
    closed = {(r["case"], r["clients"]): r for r in doc["summary"] if r["mode"] == "closed"}
    assert set(closed) == {(c, n) for c in CASES for n in LEVELS}
    for key, row in closed.items():
        assert row["rps"] > 0 and row["errors"] == 0 and row["p99_ms"] >= row["p50_ms"] > 0, key
        assert row["server_cpu_us_per_request"] > 0 and row["mean_batch"] >= 1.0, key
    grpc_runs = [r for r in doc["runs"] if r["case"] == "grpc"]
    assert grpc_runs and all(r["generator"] == "grpc.aio" for r in grpc_runs)
    assert [r["clients"] for r in doc["side_by_side"]] == list(LEVELS)
    assert all(r["grpc_vs_http_json"] > 0 and r["grpc_vs_http_binary"] > 0 for r in doc["side_by_side"])
    assert "gRPC / JSON" in (tmp_path / "protocols.md").read_text()
    assert all(r["json_grpc_on_vs_off"] > 0 for r in doc["side_by_side"])
    assert set(doc["services"]) == {"ringserve", "ringserve_grpc_off"}
    for service in doc["services"].values():
        stop = service["stop"]
        assert stop["returncode"] in (0, -signal.SIGTERM) and not stop["forced"], stop
        assert not stop["killed_children"] and not stop["removed_leftovers"], stop
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"ringserve-{stop['pid']}-")]
