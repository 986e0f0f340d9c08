"""`python -m bench [suite] [flags]`: ringserve's benchmarks, each suite one side-by-side invocation.

Suites (each starts what it measures, drives it, stops it, and writes bench/results/<suite>.json,
<suite>.md and PNG plots when matplotlib is present):

  mlp       ringserve batching vs max_batch_size 1 at 1/16/64 clients, the HTTP ceilings (raw ASGI +
            orjson, Starlette + json), --peers (MLServer, Ray Serve, LitServe), open loop at half of
            saturation, the in-process ONNX Runtime ceiling at the batch sizes formed (the default suite)
  compute   mlp_large (3 x 4096-wide layers, built here): batching vs mbs 1, latency_target_ms,
            efficiency vs the in-process ceiling
  encoder   variable lengths 1..512: padding with length buckets vs without: throughput and waste
  recovery  SIGKILL / SIGSTOP the worker, idle and under load, with and without the warm spare, next
            to a fresh interpreter's import of the worker; a soak with a death per recovery (503s, lost, wrong)
  soak      gateway + worker memory under load over --soak-s: no growth
  profile   py-spy on the gateway (and worker) under load: where each microsecond of the infer path goes
  protocol  JSON vs the binary tensor extension (bench/protocol.py, when it exists)
  scaling   several gateway processes: --gateways 1,2 (.. 8) side by side, JSON and binary, CPU µs
            per request by process role and per gateway, SO_REUSEPORT vs one shared socket,
            --providers cpu,cuda, --peers triton; bench/gpu_scaling.sh runs it on a GPU machine
  shm       Triton's system shared-memory extension vs binary HTTP tensors, 1 MiB and 16 MiB, one
            tritonclient.http client (bench/shm.py)
  protocols KServe v2 over gRPC vs HTTP JSON vs HTTP binary, one server, 1/16/64 clients
  python    a Python model (Triton's model.py running the same graph) vs the ONNX model, 1 and 64
            clients, --peers triton: Triton via PyTriton, whose Python backend runs the same path
  sequence  stateful sequences (Triton's sequence batcher, state in the server) vs stateless batching,
            batch-1 and the in-process ONNX Runtime ceiling, 1 KiB and 1 MiB of state per sequence
  openai    OpenAI's routes: stream time to first token and per-token cost over echo's pace; embeddings
            batched vs max_batch_size 1 vs the wordllama package in-process (bench/openai_routes.py)
  stream    the stream transports side by side: /generate_stream vs the OpenAI stream vs gRPC's stream on
            echo, time to first token, tokens/s and per-token cost, at 1 and 64 streams, medians over
            repeats; embeddings batched vs mbs 1 vs in-process at 64 clients (bench/stream.py)
  lanes     a fast model beside saturated slow ones (sleeping, GIL-holding Python; a heavy ONNX model),
            --lanes model vs shared, and instance_group count 1, 2, 4; memory per lane
  all       every suite above, one after the other, with the same common flags

A benchmark, not a test: nothing here is asserted. The machine is shared and noisy: every run
reports its generator's CPU and the CPU that neither the server nor the generator used.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench.suite import RESULTS_DIR

SUITE_MODULES = ("mlp", "compute", "encoder", "recovery", "soak", "profile", "scaling", "shm", "protocols",
                 "python", "sequence", "lanes", "openai_routes", "stream")
DEFAULT_SUITE = "mlp"


def _optional_protocol():
    """bench/protocol.py (JSON vs binary, 1 MiB tensors) is its own module; wired in when present.

    The hook: the module provides `add_parser(subparsers)` like the suites here (its parser sets
    `func(args, argv) -> document`), or else a `main(argv) -> int` that is run as is.
    """
    try:
        return importlib.import_module("bench.protocol")
    except ModuleNotFoundError as exc:
        if exc.name != "bench.protocol":
            raise
        return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="suite", metavar="suite")
    for name in SUITE_MODULES:
        importlib.import_module(f"bench.{name}").add_parser(subparsers)
    protocol = _optional_protocol()
    if protocol is not None and hasattr(protocol, "add_parser"):
        protocol.add_parser(subparsers)
    elif protocol is not None and hasattr(protocol, "main"):
        p = subparsers.add_parser("protocol", help="JSON vs binary (bench/protocol.py); its own flags follow",
                                  add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=lambda args, argv=None: {"returncode": protocol.main(args.rest)})
    all_parser = subparsers.add_parser("all", help="every suite, one after the other")
    all_parser.add_argument("--quick", action="store_true", help="every suite in its --quick mode")
    all_parser.add_argument("--peers", action="store_true", help="the mlp suite with --peers")
    all_parser.add_argument("--soak-s", type=float, default=None, help="soak duration (soak's default otherwise)")
    all_parser.add_argument("--skip", default="", help="comma-separated suites to leave out, e.g. protocol,soak")
    all_parser.add_argument("--out-dir", default=None)
    all_parser.add_argument("--plots-dir", default=None)
    all_parser.add_argument("-v", "--verbose", action="store_true")
    all_parser.set_defaults(func=run_all)
    return parser


def run_all(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    documents = {}
    suites = ["mlp", "compute", "encoder", "recovery", "soak", "profile", "scaling", "shm", "protocols", "python"]
    if _optional_protocol() is not None:
        suites.append("protocol")
    skipped = {name.strip() for name in args.skip.split(",") if name.strip()}
    unknown = skipped - {*suites, "protocol"}
    if unknown:
        raise SystemExit(f"--skip: unknown suite(s) {sorted(unknown)}; choose from {', '.join(suites)}")
    for suite in [s for s in suites if s not in skipped]:
        sub = [suite]
        if args.quick:
            sub.append("--quick")
        if suite == "protocol":  # bench/protocol.py has its own flags: --json instead of --out-dir
            sub += ["--json", str(Path(args.out_dir or RESULTS_DIR) / "protocol.json")]
        else:
            if args.out_dir:
                sub += ["--out-dir", args.out_dir]
            if args.plots_dir:
                sub += ["--plots-dir", args.plots_dir]
        if suite == "mlp" and args.peers:
            sub.append("--peers")
        if suite == "soak" and args.soak_s is not None:
            sub += ["--soak-s", str(args.soak_s)]
        logging.getLogger("bench").info("== python -m bench %s", " ".join(sub))
        sub_args = parser.parse_args(sub)
        documents[suite] = sub_args.func(sub_args, sub)
    return documents


def _sigterm_to_exit(signum: int, frame: object) -> None:
    # Turn SIGTERM into an exception so the suites' `finally` blocks stop their servers.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    known = set(parser._subparsers._group_actions[0].choices)
    if not argv or (argv[0] not in known and argv[0] not in ("-h", "--help")):
        argv = [DEFAULT_SUITE, *argv]  # `python -m bench --quick` is the mlp suite
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    signal.signal(signal.SIGTERM, _sigterm_to_exit)
    t = time.monotonic()
    result = args.func(args, argv)
    logging.getLogger("bench").info("done in %.0f s", time.monotonic() - t)
    if isinstance(result, dict) and isinstance(result.get("returncode"), int):
        return result["returncode"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
