"""What every suite (`python -m bench <suite>`) shares: its common flags, starting and stopping its
services, and writing its JSON, Markdown and plots."""
from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.report import describe_machine, finish_document, write_json
from bench.runner import Generator, Quiet, choose_generator, start_all
from bench.servers import Service

log = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def levels(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"levels must be >= 1, got {text!r}")
    return values


def rates(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"rates must be > 0, got {text!r}")
    return values


@dataclass(frozen=True)
class Settings:
    duration_s: float
    warmup_s: float
    repeats: int
    generator: Generator
    quick: bool
    out_dir: Path
    plots_dir: Path
    request_timeout_s: float
    ready_timeout_s: float
    keep_logs: Path | None
    workers: int
    intra_op_threads: int
    quiet_wait_s: float = 0.0
    quiet_busy_pct: float = 15.0
    max_foreign_pct: float | None = None
    noisy_retries: int = 0

    @property
    def quiet(self) -> Quiet:
        return Quiet(self.quiet_wait_s, self.quiet_busy_pct, self.max_foreign_pct, self.noisy_retries)

    def to_json(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


def add_common_arguments(parser: argparse.ArgumentParser, defaults: dict[str, Any], quick: dict[str, Any]) -> None:
    g = parser.add_argument_group("common")
    g.add_argument("--duration-s", type=float, default=None,
                   help=f"measured seconds per run (default {defaults['duration_s']:g}; wrk rounds to whole seconds)")
    g.add_argument("--warmup-s", type=float, default=None,
                   help=f"unmeasured seconds before each run (default {defaults['warmup_s']:g})")
    g.add_argument("--repeats", type=int, default=None,
                   help=f"runs per case and level; medians are reported (default {defaults['repeats']})")
    g.add_argument("--quick", action="store_true",
                   help=f"for tests: {', '.join(f'{k}={v}' for k, v in quick.items())} (explicit flags still win)")
    g.add_argument("--load", choices=("auto", "wrk", "aiohttp"), default="auto",
                   help="closed-loop generator: wrk with a Lua script when installed (auto), else aiohttp; "
                        "open loop is always aiohttp")
    g.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="JSON and Markdown go here")
    g.add_argument("--plots-dir", type=Path, default=None, help="PNG plots go here (default: --out-dir)")
    g.add_argument("--workers", type=int, default=1, help="ringserve --workers")
    g.add_argument("--intra-op-threads", type=int, default=1, help="ringserve --intra-op-threads")
    g.add_argument("--request-timeout-s", type=float, default=30.0, help="client timeout per request")
    g.add_argument("--ready-timeout-s", type=float, default=180.0, help="wait this long for a server to be ready")
    g.add_argument("--quiet-wait-s", type=float, default=None,
                   help="before each run, wait up to this long for the machine to be nearly idle (default 20; "
                        "--quick 0): it may be shared, and another process's load is not ours to measure")
    g.add_argument("--quiet-busy-pct", type=float, default=15.0,
                   help="nearly idle = at most this %% of the whole machine busy (default 15)")
    g.add_argument("--max-foreign-pct", type=float, default=None,
                   help="a run during which other processes used more than this %% of one core is discarded "
                        "and measured again (default 50; --quick: never)")
    g.add_argument("--noisy-retries", type=int, default=2, help="at most this many re-measurements per run")
    g.add_argument("--keep-logs", type=Path, default=None, help="copy server logs into this directory")
    g.add_argument("-v", "--verbose", action="store_true")


def pick(args: argparse.Namespace, name: str, defaults: dict[str, Any], quick: dict[str, Any]) -> Any:
    """An explicit flag wins, then --quick's value, then the default."""
    value = getattr(args, name, None)
    if value is not None:
        return value
    if args.quick and name in quick:
        return quick[name]
    return defaults[name]


def resolve_common(args: argparse.Namespace, defaults: dict[str, Any], quick: dict[str, Any]) -> Settings:
    settings = Settings(
        duration_s=pick(args, "duration_s", defaults, quick), warmup_s=pick(args, "warmup_s", defaults, quick),
        repeats=pick(args, "repeats", defaults, quick), generator=choose_generator(args.load), quick=args.quick,
        out_dir=args.out_dir, plots_dir=args.plots_dir or args.out_dir, request_timeout_s=args.request_timeout_s,
        ready_timeout_s=args.ready_timeout_s, keep_logs=args.keep_logs, workers=args.workers,
        intra_op_threads=args.intra_op_threads,
        quiet_wait_s=args.quiet_wait_s if args.quiet_wait_s is not None else (0.0 if args.quick else 20.0),
        quiet_busy_pct=args.quiet_busy_pct,
        max_foreign_pct=args.max_foreign_pct if args.max_foreign_pct is not None else (None if args.quick else 50.0),
        noisy_retries=args.noisy_retries)
    if settings.repeats < 1 or settings.duration_s <= 0 or settings.warmup_s < 0:
        raise SystemExit("need --repeats >= 1, --duration-s > 0, --warmup-s >= 0")
    return settings


def command_line(argv: Sequence[str] | None) -> str:
    return shlex.join([Path(sys.executable).name, "-m", "bench", *(sys.argv[1:] if argv is None else argv)])


@contextlib.contextmanager
def workspace(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"ringserve-bench-{prefix}-") as tmp:
        yield Path(tmp)


@contextlib.contextmanager
def running(services: Sequence[Service], settings: Settings, document: dict[str, Any]) -> Iterator[None]:
    """Start the services (recording each in the document); stop all of them, whatever happens."""
    try:
        start_all(services, settings.ready_timeout_s)
        for service in services:
            entry = document["services"].setdefault(service.name, {})
            entry.update({"kind": service.kind, "description": service.description, "command": service.args,
                          "ready_s": round(service.ready_s or 0.0, 2), "pids_by_role": service.pids_by_role()})
        yield
    finally:
        for service in services:
            report = service.stop()
            document["services"].setdefault(service.name, {})["stop"] = report
            if settings.keep_logs is not None and service.log_path.exists():
                settings.keep_logs.mkdir(parents=True, exist_ok=True)
                (settings.keep_logs / service.log_path.name).write_bytes(service.log_path.read_bytes())


def write_outputs(document: dict[str, Any], settings: Settings, markdown: str) -> tuple[Path, Path]:
    """<out>/<suite>.json and <out>/<suite>.md; the Markdown also goes to stdout."""
    finish_document(document)
    suite = document["suite"]
    header = (f"## {document['benchmark']}\n\n`{document['command']}`\n\n"
              f"Machine: {describe_machine(document['machine'])}. Runs: {settings.warmup_s:g} s warm-up + "
              f"{settings.duration_s:g} s measured, median of {settings.repeats}; load generator "
              f"{settings.generator}.\n\n")
    md = header + markdown.strip() + "\n"
    document["markdown"] = md
    json_path = write_json(settings.out_dir / f"{suite}.json", document, clean=True)
    md_path = settings.out_dir / f"{suite}.md"
    md_path.write_text(md)
    print("\n" + md)
    print(f"wrote {json_path} and {md_path}")
    return json_path, md_path
