"""The serve flags' values: argparse types for sizes, device lists and booleans, and the Settings built from
the flags given (the API key and the OpenTelemetry endpoint read once, here)."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import fields
from pathlib import Path

from ringserve.common import tracing
from ringserve.common.errors import SettingError
from ringserve.common.settings import Settings

ENV_API_KEY = "RINGSERVE_API_KEY"  # the key itself: the alternative to --api-key-file
_SETTING_NAMES = frozenset(f.name for f in fields(Settings)) - {"api_key"}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_bytes(text: str) -> int:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, '1000' -> 1000."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; use bytes or a number with B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def parse_gpus(text: str) -> tuple[int, ...]:
    """'0,1' -> (0, 1): CUDA device ids, dealt to the workers in turn."""
    try:
        gpus = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        gpus = ()
    if not gpus or any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of CUDA device ids; use e.g. 0 or 0,1")
    return gpus


def parse_bool(text: str) -> bool:
    """Triton's spelling of a boolean flag's value: --strict-readiness=false."""
    value = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
    if text.lower() not in value:
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return value[text.lower()]


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the serve flags given; a flag not given keeps the Settings default (argparse has none)."""
    given = {name: value for name, value in vars(args).items() if name in _SETTING_NAMES}
    given["model_repository"] = str(Path(args.model_repository).resolve())
    given["api_key"] = read_api_key(getattr(args, "api_key_file", None))
    given["otel_endpoint"] = otel_endpoint(given.get("otel_endpoint"))
    for name in ("client_shm_key_prefixes", "load_models", "metrics_config"):  # (argparse's append gives a list)
        if name in given:
            given[name] = tuple(given[name])
    return Settings(**given)


def otel_endpoint(flag: str | None) -> str | None:
    """--otel-endpoint, else $OTEL_EXPORTER_OTLP_ENDPOINT, else None: read once, here, so that every
    process the supervisor starts reads the one value from the settings file. Checked before any
    process starts: a server asked to trace needs the otel extra installed."""
    try:
        endpoint = tracing.resolve_endpoint(flag)
    except ValueError as exc:
        raise SettingError("otel_endpoint", str(exc)) from None
    missing = None if endpoint is None else tracing.missing_packages()
    if missing:
        raise SettingError("otel_endpoint", missing)
    return endpoint


def read_api_key(path: str | None) -> str | None:
    """The key from --api-key-file, else $RINGSERVE_API_KEY, else None (no key needed).

    Read once, here: it reaches the gateway and the supervisor's health probe in the settings
    file (0600), never on a command line.
    """
    if path is None:
        return os.environ.get(ENV_API_KEY) or None
    try:
        key = Path(path).read_text().strip()
    except OSError as exc:
        raise SettingError("api_key_file", f"cannot read the API key file: {exc}") from None
    if not key:
        raise SettingError("api_key_file", f"the API key file {Path(path).resolve()} is empty")
    return key
