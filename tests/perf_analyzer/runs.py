"""Running Triton's perf_analyzer (bench/perf_analyzer.py installs it) against a real stack, and
reading what it printed: the client's latency and the server-side breakdown of each measurement."""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import perf_analyzer

from tests.support.stack import Stack

# Short windows, and "stable" within 100 %: the shared machine is noisy, and these runs check that
# every mode completes with server statistics perf_analyzer accepts, not what the numbers are.
QUICK = ["--measurement-interval", "500", "--stability-percentage", "100", "--max-trials", "10"]
CLIENT = re.compile(r"^\s+Avg latency: (\d+) usec", re.M)
SERVER = re.compile(r"^\s+Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ "
                    r"compute input (\d+) usec \+ compute infer (\d+) usec \+ compute output (\d+) usec\)", re.M)


@dataclass(frozen=True)
class Measurement:
    client_us: int  # the client's average latency
    server_us: int  # the server's average request latency (statistics: success.ns / count)
    parts_us: tuple[int, ...]  # overhead, queue, compute input, compute infer, compute output

    @property
    def coverage(self) -> float:
        """How much of the client's latency the server's statistics account for."""
        return self.server_us / self.client_us


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    measurements: list[Measurement]


def command() -> list[str]:
    """perf_analyzer's command line; skips the test (saying why) where it cannot be installed."""
    try:
        return perf_analyzer.command()
    except perf_analyzer.CannotInstall as exc:
        pytest.skip(f"perf_analyzer cannot be installed here: {exc}")


def run(stack: Stack, model: str, *args: str, grpc: bool = False, timeout_s: float = 180) -> Run:
    url = f"127.0.0.1:{stack.grpc_port}" if grpc else f"127.0.0.1:{stack.port}"
    argv = [*command(), "-m", model, "-u", url, "-i", "grpc" if grpc else "http", *QUICK, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    output = done.stdout + done.stderr
    clients = [int(m) for m in CLIENT.findall(output)]
    servers = SERVER.findall(output)
    measurements = [Measurement(c, int(s[0]), tuple(int(p) for p in s[1:])) for c, s in zip(clients, servers)]
    return Run(done.returncode, output, measurements)


def assert_completed(result: Run, measurements: int = 1) -> None:
    """It ran every measurement to its end, each with a server-side breakdown."""
    assert result.returncode == 0, result.output[-3000:]
    assert "compute counts must be the same" not in result.output
    assert len(result.measurements) == measurements, result.output[-3000:]
    for m in result.measurements:
        overhead, *stages = m.parts_us
        assert m.server_us > 0 and all(part >= 0 for part in m.parts_us), m
        assert sum(stages) <= m.server_us + len(stages), m  # (each part rounded down to a µs)


def csv_rows(path: Path) -> list[dict[str, str]]:
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","))) for line in lines[1:] if line.strip()]
