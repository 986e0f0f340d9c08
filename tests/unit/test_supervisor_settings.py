"""The serve flags of this change: sizes like 2GiB, and ServeSettings refusing nonsense early."""
from __future__ import annotations

import argparse

import pytest

from cli import build_parser, parse_bytes
from common.errors import ConfigError
from supervisor import ServeSettings, backoff_s


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
    assert (args.max_batches_per_worker, args.worker_memory_limit, args.runtime_dir) == (1000, 2 * 2**30,
                                                                                         "/run/ringserve")


@pytest.mark.parametrize("field, value", [("workers", 0), ("max_batches_per_worker", -1),
                                          ("worker_memory_limit_bytes", -5), ("drain_timeout_s", -1.0)])
def test_settings_refuse_nonsense(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        ServeSettings(model_repository="/m", **{field: value})


def test_backoff_is_immediate_first_then_doubles_to_a_ceiling() -> None:
    assert [backoff_s(n) for n in (1, 3, 4, 5, 6)] == [0.0, 0.0, 0.1, 0.2, 0.4]
    assert backoff_s(100) == 10.0
