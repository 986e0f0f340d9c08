"""Triton's own benchmark client, perf_analyzer, completes a run against ringserve (HTTP, one
client) with the server-side statistics it asks for. Skipped, saying why, where perf_analyzer
cannot be installed (bench/perf_analyzer.py: not Debian, no network). Every other mode a Triton
user runs is the slower suite tests/perf_analyzer/modes.py (`make test-perf-analyzer`)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ..perf_analyzer import runs
from tests.support.stack import running_stack

pytestmark = pytest.mark.integration


def test_a_perf_analyzer_run_completes_with_the_server_side_breakdown(demo_repo: Path):
    runs.command()  # (installs it first, or skips)
    with running_stack(demo_repo) as stack:
        result = runs.run(stack, "mlp")

    runs.assert_completed(result)
    (measured,) = result.measurements
    print(f"perf_analyzer, HTTP, 1 client: client {measured.client_us} us, server {measured.server_us} us "
          f"({measured.coverage:.0%}; overhead, queue, compute input/infer/output: {measured.parts_us} us)")
    assert measured.server_us <= measured.client_us
