"""`python -m bench protocols --quick`, for real: gRPC unary and streaming, HTTP JSON and HTTP binary each
measured side by side, by perf_analyzer where it can be installed (else gRPC by grpc.aio, streaming left out).

Structure only, never speed: the machine is shared and has 2 CPUs.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.bench_quick import run_quick

pytestmark = pytest.mark.integration

PA_CASES = ("grpc", "grpc_stream", "http_json", "http_binary")
FALLBACK_CASES = ("grpc", "http_json", "http_binary")  # (no perf_analyzer: grpc.aio, and the suite's HTTP generator)
ALWAYS = ("http_json_wrk", "http_json_grpc_off", "http_json_public", "http_binary_public")  # (public: --http-engine uvicorn)
LEVELS = (1, 4)  # the suite's --quick concurrency


def test_every_protocol_is_measured_side_by_side_and_the_server_stops_clean(tmp_path: Path):
    doc = run_quick("protocols", tmp_path)
    assert doc["suite"] == "protocols" and doc["settings"]["quick"] is True
    with_pa = "missing" not in doc["perf_analyzer"]
    cases = (*(PA_CASES if with_pa else FALLBACK_CASES), *ALWAYS)
    if not with_pa:
        print(f"perf_analyzer cases not run: {doc['perf_analyzer']['missing']}")
    closed = {(r["case"], r["clients"]): r for r in doc["summary"] if r["mode"] == "closed"}
    assert set(closed) == {(c, n) for c in cases for n in LEVELS}
    for key, row in closed.items():
        assert row["rps"] > 0 and row["errors"] == 0 and row["p99_ms"] >= row["p50_ms"] > 0, key
        assert row["server_cpu_us_per_request"] > 0 and row["mean_batch"] >= 1.0, key
    grpc_runs = [r for r in doc["runs"] if r["case"] == "grpc"]
    assert grpc_runs and all(r["generator"] == ("perf_analyzer" if with_pa else "grpc.aio") for r in grpc_runs)
    if with_pa:  # perf_analyzer's count of the window's requests is the server's statistics'
        assert all(r["requests"] > 0 for r in doc["runs"] if r["case"] in PA_CASES)
    assert [r["clients"] for r in doc["side_by_side"]] == list(LEVELS)
    assert all(r["grpc_vs_http_json"] > 0 and r["grpc_vs_http_binary"] > 0 for r in doc["side_by_side"])
    assert all((r["stream_vs_http_binary"] or 0) > 0 for r in doc["side_by_side"]) == with_pa
    report = (tmp_path / "protocols.md").read_text()
    assert "grpc / http_binary" in report and "inf/exec" in report
    assert all(r["json_grpc_on_vs_off"] > 0 for r in doc["side_by_side"])
    assert all(r["json_public_vs_fast"] > 0 and r["binary_public_vs_fast"] > 0 for r in doc["side_by_side"])
    assert set(doc["services"]) == {"ringserve", "ringserve_grpc_off", "ringserve_public"}
    for service in doc["services"].values():
        stop = service["stop"]
        assert stop["returncode"] in (0, -signal.SIGTERM) and not stop["forced"], stop
        assert not stop["killed_children"] and not stop["removed_leftovers"], stop
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"ringserve-{stop['pid']}-")]
