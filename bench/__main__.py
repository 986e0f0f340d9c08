"""`python -m bench`: ringserve with server-side batching vs max_batch_size 1, closed-loop load.

Both cases' servers run for the whole invocation (an idle one costs well under 1 % of a core)
and the runs are interleaved (repeat, then clients, then case), so a slow drift of the
machine hits both cases alike. Every run is warm-up + measurement window; the table shows
the median over repeats (each column independently) and the errors summed over repeats;
the JSON keeps every run's raw numbers. A benchmark, not a test: nothing here is asserted.
"""
from __future__ import annotations

import argparse
import datetime
import logging
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.load import make_infer_body, run_load
from bench.report import machine_info, render_table, summarize, write_json
from bench.servers import Server, build_case_repositories

log = logging.getLogger("bench")

MODEL = "mlp"
CASES = {
    "batched": "mlp, max_batch_size 64 + dynamic_batching (demo config)",
    "unbatched": "mlp, max_batch_size 1, no dynamic_batching",
}
CASE_LABELS = {"batched": "batching (mbs 64)", "unbatched": "no batching (mbs 1)"}
DEFAULTS = {"concurrency": "1,16,64", "duration_s": 10.0, "warmup_s": 2.0, "repeats": 3}
QUICK = {"concurrency": "1,4", "duration_s": 1.0, "warmup_s": 0.3, "repeats": 1}
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "backbone.json"


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1, got {text!r}")
    return levels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=_levels, default=None,
                        help=f"comma-separated client counts (default {DEFAULTS['concurrency']})")
    parser.add_argument("--duration-s", type=float, default=None,
                        help=f"measured seconds per run (default {DEFAULTS['duration_s']:g})")
    parser.add_argument("--warmup-s", type=float, default=None,
                        help=f"unmeasured seconds before each run (default {DEFAULTS['warmup_s']:g})")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"runs per case and level; the median is reported (default {DEFAULTS['repeats']})")
    parser.add_argument("--quick", action="store_true",
                        help="for tests: concurrency 1,4, 1 s runs, 0.3 s warm-up, 1 repeat "
                             "(explicit flags still win)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"subset of {','.join(CASES)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results (directories are created)")
    parser.add_argument("--workers", type=int, default=1, help="ringserve --workers")
    parser.add_argument("--intra-op-threads", type=int, default=1, help="ringserve --intra-op-threads")
    parser.add_argument("--request-timeout-s", type=float, default=30.0, help="client timeout per request")
    parser.add_argument("--ready-timeout-s", type=float, default=90.0, help="wait this long for a server")
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy server logs into this directory")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """Explicit flags win, then --quick, then the defaults."""
    base = QUICK if args.quick else DEFAULTS
    settings = {
        "concurrency": args.concurrency or _levels(base["concurrency"]),
        "duration_s": args.duration_s if args.duration_s is not None else base["duration_s"],
        "warmup_s": args.warmup_s if args.warmup_s is not None else base["warmup_s"],
        "repeats": args.repeats if args.repeats is not None else base["repeats"],
        "cases": [c.strip() for c in args.cases.split(",") if c.strip()],
        "quick": args.quick, "workers": args.workers, "intra_op_threads": args.intra_op_threads,
        "request_timeout_s": args.request_timeout_s, "model": MODEL,
    }
    unknown = set(settings["cases"]) - set(CASES)
    if unknown or not settings["cases"]:
        raise SystemExit(f"--cases: unknown {sorted(unknown)}; choose from {sorted(CASES)}")
    if settings["repeats"] < 1 or settings["duration_s"] <= 0 or settings["warmup_s"] < 0:
        raise SystemExit("need --repeats >= 1, --duration-s > 0, --warmup-s >= 0")
    return settings


def _sigterm_to_exit(signum: int, frame: object) -> None:
    # Turn SIGTERM into an exception so the `finally` below stops the servers.
    raise SystemExit(128 + signum)


def run(settings: dict[str, Any], out: Path, command: str, keep_logs: Path | None = None,
        ready_timeout_s: float = 90.0) -> dict[str, Any]:
    body = make_infer_body()
    document: dict[str, Any] = {
        "benchmark": "ringserve backbone: server-side batching vs max_batch_size 1",
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command, "argv": sys.argv, "settings": settings, "machine": machine_info(),
        "load_generator": {"kind": "closed loop, asyncio + aiohttp, one keep-alive connection per client",
                           "body_bytes": len(body), "same_process_as_server": False,
                           "gen_cpu_pct": "user+system CPU of the generator process / window wall time; "
                                          "100 = one core"},
        "summary_rule": "median over repeats of each column independently; errors summed over repeats",
        "cases": {}, "runs": [], "summary": [],
    }
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory(prefix="ringserve-bench-") as tmp:
        try:
            repos = build_case_repositories(Path(tmp), MODEL)
            for case in settings["cases"]:
                server = Server(repos[case], name=case, log_dir=Path(tmp) / "logs", workers=settings["workers"],
                                intra_op_threads=settings["intra_op_threads"])
                servers[case] = server
                server.start(ready_timeout_s=ready_timeout_s, models=(MODEL,))
                document["cases"][case] = {
                    "description": CASES[case], "server_command": server.args,
                    "config": (repos[case] / MODEL / "config.json").read_text(),
                    "execution_provider": server.log_lines("execution provider"),
                }
            total = settings["repeats"] * len(settings["concurrency"]) * len(settings["cases"])
            done = 0
            for repeat in range(settings["repeats"]):
                for clients in settings["concurrency"]:
                    for case in settings["cases"]:
                        done += 1
                        result = run_load(servers[case].url, MODEL, body, concurrency=clients,
                                          duration_s=settings["duration_s"], warmup_s=settings["warmup_s"],
                                          request_timeout_s=settings["request_timeout_s"]).to_json()
                        document["runs"].append({"case": case, "repeat": repeat, **result})
                        mean_batch = result["mean_batch"]
                        log.info("[%d/%d] %-9s repeat %d, %3d clients: %8.0f req/s, p50 %.2f ms, "
                                 "p99 %.2f ms, errors %d, mean batch %s, gen CPU %.0f%%",
                                 done, total, case, repeat, clients, result["rps"] or 0, result["p50_ms"] or 0,
                                 result["p99_ms"] or 0, result["errors"],
                                 "-" if mean_batch is None else f"{mean_batch:.1f}", result["gen_cpu_pct"] or 0)
                        if result["errors"]:
                            log.warning("errors: %s; samples: %s", result["errors_by_kind"], result["error_samples"])
        finally:
            for case, server in servers.items():
                report = server.stop()
                if case in document["cases"]:
                    document["cases"][case]["stop"] = report
                if keep_logs is not None:
                    keep_logs.mkdir(parents=True, exist_ok=True)
                    if server.log_path.exists():
                        (keep_logs / server.log_path.name).write_bytes(server.log_path.read_bytes())
    document["finished_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    document["machine"]["loadavg_at_end"] = list(os.getloadavg())  # includes the bench's own load
    for clients in settings["concurrency"]:
        for case in settings["cases"]:
            runs = [r for r in document["runs"] if r["case"] == case and r["clients"] == clients]
            document["summary"].append({"label": CASE_LABELS[case], **summarize(case, clients, runs)})
    write_json(out, document)
    return document


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    settings = resolve(args)
    command = shlex.join([Path(sys.executable).name, "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    signal.signal(signal.SIGTERM, _sigterm_to_exit)
    t = time.monotonic()
    document = run(settings, args.out, command, keep_logs=args.keep_logs, ready_timeout_s=args.ready_timeout_s)
    print(f"\n{document['benchmark']}")
    print(f"machine: {document['machine']['nproc']} CPUs ({document['machine']['cpu_model']}), "
          f"python {document['machine']['python']}, {document['machine']['onnxruntime']}")
    print(f"runs: {settings['warmup_s']:g} s warm-up + {settings['duration_s']:g} s measured, "
          f"median of {settings['repeats']}; errors summed; gen CPU % = load generator, 100 = one core\n")
    print(render_table(document["summary"]))
    print(f"\nwrote {args.out} ({time.monotonic() - t:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
