"""The serve flags of this change: sizes like 2GiB, settings refusing nonsense early, the hang rule."""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

import pytest

from ringserve.cli import build_parser, parse_bytes, settings_from_args
from ringserve.common.errors import ConfigError
from ringserve.common.exits import REASON_HUNG
from ringserve.common.settings import Settings
from ringserve.supervision.children import Child, backoff_s
from ringserve.supervisor import Supervisor


@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("1000", 1000), ("2GiB", 2 * 2**30), ("512MB", 512 * 10**6), ("1.5G", 1_500_000_000),
    ("64 KiB", 64 * 1024), ("3tib", 3 * 2**40),
])
def test_sizes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "2 parsecs", "GiB", "1e9"])
def test_not_a_size_says_what_is_accepted(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="KiB, MiB, GiB"):
        parse_bytes(text)


def test_recycling_flags_reach_the_settings() -> None:
    args = build_parser().parse_args(["serve", "--model-repository", "/m", "--max-batches-per-worker", "1000",
                                      "--worker-memory-limit", "2GiB", "--runtime-dir", "/run/ringserve"])
    settings = settings_from_args(args)
    assert (settings.max_batches_per_worker, settings.worker_memory_limit_bytes, settings.runtime_dir) == (
        1000, 2 * 2**30, "/run/ringserve")


@pytest.mark.parametrize("field, value", [("workers", 0), ("max_batches_per_worker", -1),
                                          ("worker_memory_limit_bytes", -5), ("drain_timeout_s", -1.0),
                                          ("hang_timeout_s", 0.0), ("worker_start_timeout_s", -1.0)])
def test_settings_refuse_nonsense(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        Settings(model_repository="/m", **{field: value})


def test_backoff_is_immediate_first_then_doubles_to_a_ceiling() -> None:
    assert [backoff_s(n) for n in (1, 3, 4, 5, 6)] == [0.0, 0.0, 0.1, 0.2, 0.4]
    assert backoff_s(100) == 10.0


def test_start_timeout_flag_reaches_the_settings() -> None:
    args = build_parser().parse_args(["serve", "--model-repository", "/m", "--worker-start-timeout-s", "90"])
    assert settings_from_args(args).worker_start_timeout_s == 90.0
    assert settings_from_args(build_parser().parse_args(["serve", "--model-repository", "/m"])
                              ).worker_start_timeout_s == 60.0


def test_a_worker_is_judged_hung_by_the_start_timeout_until_its_first_heartbeat() -> None:
    """An overloaded host stretched a new worker's imports past the hang timeout: every restart
    was killed as hung. Silence counts against hang_timeout_s only once a heartbeat came."""
    supervisor = Supervisor(Settings(model_repository="/m", hang_timeout_s=5.0, worker_start_timeout_s=60.0))
    now = time.monotonic()
    # (silent for, heard from) -> killed as hung?
    cases = {(10.0, False): False, (10.0, True): True, (61.0, False): True, (1.0, True): False}
    children = {}
    try:
        for index, ((silent_s, heard), _) in enumerate(cases.items()):
            process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            child = Child("worker", index, 1, process, started_at=now - silent_s, last_heartbeat=now - silent_s,
                          heard=heard)
            supervisor.children.add(child)
            children[(silent_s, heard)] = child
        supervisor.workers.murder_hung()
        assert {key: child.kill_reason == REASON_HUNG for key, child in children.items()} == cases
        for key, child in children.items():
            if cases[key]:
                assert child.process.wait(5) == -9, key  # SIGKILL
    finally:
        for child in children.values():
            child.process.kill()
            child.process.wait()


def test_reuse_port_reaches_the_settings_and_needs_a_fixed_port() -> None:
    args = build_parser().parse_args(["serve", "--model-repository", "/m", "--reuse-port", "--gateways", "2"])
    assert (settings_from_args(args).reuse_port, settings_from_args(args).gateways) == (True, 2)
    assert not Settings(model_repository="/m").reuse_port
    with pytest.raises(ConfigError, match="reuse_port"):
        Settings(model_repository="/m", reuse_port=True, port=0)


def test_gateways_listen_on_one_shared_socket_or_each_on_its_own_with_reuse_port() -> None:
    import socket

    from ringserve.common.listen import listen_socket

    shared = listen_socket("127.0.0.1", 0)
    port = shared.getsockname()[1]
    try:
        with pytest.raises(OSError):  # a second plain socket on a listening port: EADDRINUSE
            listen_socket("127.0.0.1", port)
    finally:
        shared.close()
    first = listen_socket("127.0.0.1", 0, reuse_port=True)
    port = first.getsockname()[1]
    second = listen_socket("127.0.0.1", port, reuse_port=True)
    try:
        assert second.getsockname()[1] == port
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # accepted into one of the two backlogs
    finally:
        first.close()
        second.close()
