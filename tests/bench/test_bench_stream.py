"""`python -m bench stream --quick`, for real: the three stream transports and the embeddings cases side by side.

Structure only, never speed: the machine is shared and has 2 CPUs.
"""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.bench_quick import run_quick

pytestmark = pytest.mark.integration

LEVELS = (1, 4)  # the suite's --quick concurrency
TRANSPORTS = ("generate_stream", "openai", "grpc")


def test_every_stream_transport_and_every_embeddings_case_is_measured_and_the_server_stops_clean(tmp_path: Path):
    doc = run_quick("stream", tmp_path)

    assert doc["suite"] == "stream" and doc["settings"]["quick"] is True
    streams = {(r["transport"], r["clients"]): r for r in doc["streams"]}
    assert set(streams) == {(t, n) for t in TRANSPORTS for n in LEVELS}
    for key, row in streams.items():
        # every stream carried all its tokens (a short one is an error), at about the model's pace or slower
        assert row["errors"] == 0 and row["tokens_per_s"] > 0, key
        assert row["gap_p50_ms"] >= doc["settings"]["token_delay_ms"] * 0.9, key
        assert row["ttft_p50_ms"] > 0 and row["added_whole_stream_ms"] is not None, key
    cases = {r["case"]: r for r in doc["embeddings"]}
    assert set(cases) == {"embed", "embed_mbs1", "in-process, 1 per call", "in-process, 64 per call"}
    assert all(r["rps"] > 0 for r in doc["embeddings"])
    assert cases["embed_mbs1"]["mean_batch"] == 1.0 and cases["embed"]["mean_batch"] >= 1.0  # the statistics'
    assert all(row["server_cpu_us_per_token"] > 0 for row in doc["streams"])
    assert "added/token, whole stream" in (tmp_path / "stream.md").read_text()
    for service in doc["services"].values():
        stop = service["stop"]
        assert stop["returncode"] in (0, -signal.SIGTERM) and not stop["forced"] and not stop["removed_leftovers"]
