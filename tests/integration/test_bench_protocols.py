"""`python -m bench protocols --quick`, for real: gRPC, HTTP JSON and HTTP binary each measured, side by side.

Structure only, never speed: the machine is shared and has 2 CPUs.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.bench_quick import run_quick

pytestmark = pytest.mark.integration

CASES = ("grpc", "http_json", "http_binary", "http_json_grpc_off")
LEVELS = (1, 4)  # the suite's --quick concurrency


def test_every_protocol_is_measured_side_by_side_and_the_server_stops_clean(tmp_path: Path):
    doc = run_quick("protocols", tmp_path)
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
