"""`python -m bench scaling --quick`, for real: every case measured, CPU split by process role.

Structure only, never speed: the machine is shared and has 2 CPUs.
"""
from __future__ import annotations

import os
import signal

import pytest

from tests.support.bench_quick import run_quick

pytestmark = pytest.mark.integration

CASES = ("g1_cpu_json", "g1_cpu_binary", "g2_cpu_json", "g2_cpu_binary")
LEVELS = (1, 4)  # the suite's --quick concurrency


@pytest.fixture(scope="module")
def scaling(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-scaling")
    return out, run_quick("scaling", out)


def test_every_case_has_numbers_and_a_cpu_split_by_role(scaling):
    _, doc = scaling
    assert doc["suite"] == "scaling" and doc["settings"]["quick"] is True
    assert doc["command"].endswith("-m bench scaling --quick --out-dir " + doc["settings"]["out_dir"])
    closed = {(r["case"], r["clients"]): r for r in doc["summary"] if r["mode"] == "closed"}
    assert {(c, n) for c in CASES for n in LEVELS} <= set(closed)
    for key, row in closed.items():
        assert row["rps"] > 0 and row["errors"] == 0 and row["p99_ms"] >= row["p50_ms"] > 0, key
        if key[0].startswith("g"):
            roles = row["cpu_us_by_role"]
            assert roles.get("gateway", 0) > 0 and roles.get("worker", 0) > 0, (key, roles)
            assert row["gateway_count"] >= 1 and row["gateways"], key
            assert row["mean_batch"] and row["mean_batch"] >= 1.0, key
    for run in doc["runs"]:
        assert run["server_cpu_us_per_request_by_role"] and run["cpu_by_process"], run["case"]
        assert run["gateway_requests_source"], run["case"]


def test_ratios_listening_and_projection_are_derived(scaling):
    out, doc = scaling
    assert {(r["payload"], r["clients"], r["gateways"]) for r in doc["ratios"]} == {
        (p, n, 2) for p in ("json", "binary") for n in LEVELS}
    assert all(r["rps_ratio"] > 0 for r in doc["ratios"])
    assert {r["mode"] for r in doc["listening"]} >= {"one shared socket"}
    if doc["server_flags"]["--reuse-port"]:
        reuse = [r for r in doc["summary"] if r["case"] == "g2rp_cpu_json"]
        assert reuse and all(r["rps"] > 0 and r["errors"] == 0 for r in reuse)
        assert {r["mode"] for r in doc["listening"]} == {"one shared socket", "SO_REUSEPORT, a socket per gateway"}
    else:
        assert "--reuse-port" in doc["skipped"]["g2rp_cpu_json"]
    assert {r["gateways"] for r in doc["projection"]} >= {1, 2, 4, 8}
    assert all(r["projected_rps"] > 0 and r["bound_by"] in ("gateways", "worker", "cores") for r in doc["projection"])
    assert doc["providers"]["g1_cpu"]["workers"][0]["models"] == {"mlp": "CPUExecutionProvider"}
    md = (out / "scaling.md").read_text()
    assert md.startswith("## ") and "G gateways against G = 1" in md and "Projection to 16 CPUs" in md


def test_every_server_stopped_cleanly(scaling):
    _, doc = scaling
    ringserve = {name: s for name, s in doc["services"].items() if s.get("kind") == "ringserve"}
    assert set(ringserve) >= {"g1_cpu", "g2_cpu"}
    for name, service in ringserve.items():
        stop = service["stop"]
        assert stop["returncode"] in (0, -signal.SIGTERM) and not stop["forced"], (name, stop)
        assert not stop["killed_children"] and not stop["removed_leftovers"], (name, stop)
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"ringserve-{stop['pid']}-")], name
