"""`ringserve`: serve, build demo models, show a running server's status."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

from ringserve.common.errors import ConfigError
from ringserve.common.process import configure_logging

EXIT_USAGE = 2
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
               "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, '1000' -> 1000."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; use bytes or a number with B, KB, MB, GB, TB, KiB, MiB, GiB or TiB")
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


def _serve(args: argparse.Namespace) -> int:
    from ringserve.supervisor import ServeSettings, Supervisor

    configure_logging("supervisor", args.log_level)
    try:
        settings = ServeSettings(
            model_repository=str(Path(args.model_repository).resolve()), host=args.host, port=args.port,
            workers=args.workers, standby_workers=args.standby_workers, slot_count=args.slot_count, slot_mb=args.slot_mb,
            hang_timeout_s=args.hang_timeout_s, start_timeout_s=args.worker_start_timeout_s,
            batch_timeout_s=args.batch_timeout_s,
            hold_when_unavailable_s=args.hold_when_unavailable_s, request_timeout_s=args.request_timeout_s,
            max_attempts=args.max_attempts, drain_timeout_s=args.drain_timeout_s,
            max_batches_per_worker=args.max_batches_per_worker,
            worker_memory_limit_bytes=args.worker_memory_limit, runtime_dir=args.runtime_dir,
            intra_op_threads=args.intra_op_threads, cpu_only=args.cpu_only, log_level=args.log_level,
            model_memory_budget_bytes=args.model_memory_budget, gpus=args.gpus,
            cuda_arena_extend_strategy=args.cuda_arena_extend_strategy,
            cudnn_conv_algo_search=args.cudnn_conv_algo_search)
    except ConfigError as exc:
        print(f"ringserve serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    problem = _export_gateway_options(args)
    if problem is not None:
        print(f"ringserve serve: {problem}", file=sys.stderr)
        return EXIT_USAGE
    return Supervisor(settings).run()


def _export_gateway_options(args: argparse.Namespace) -> str | None:
    """Gateway-only options travel in the environment, which the supervisor's children inherit."""
    if args.api_key_file is not None:
        path = Path(args.api_key_file).resolve()
        try:
            if not path.read_text().strip():
                return f"the API key file {path} is empty"
        except OSError as exc:
            return f"cannot read the API key file: {exc}"
        os.environ["RINGSERVE_API_KEY_FILE"] = str(path)
    if args.api_key_everywhere:
        os.environ["RINGSERVE_API_KEY_EVERYWHERE"] = "1"
    if args.max_request_bytes is not None:
        os.environ["RINGSERVE_MAX_REQUEST_BYTES"] = str(args.max_request_bytes)
    if args.body_timeout_s is not None:
        os.environ["RINGSERVE_BODY_TIMEOUT_S"] = str(args.body_timeout_s)
    return None


def _demo_models(args: argparse.Namespace) -> int:
    from ringserve.common.demo_models import build_demo_models

    names = build_demo_models(Path(args.directory))
    print(f"wrote {', '.join(names)} to {args.directory}")
    return 0


def _status(args: argparse.Namespace) -> int:
    try:
        with urllib.request.urlopen(args.url.rstrip("/") + "/admin/status", timeout=5) as response:
            status = json.load(response)
    except (urllib.error.URLError, OSError) as exc:
        print(f"cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"ready: {status['ready']}   draining: {status['draining']}   "
          f"slots free: {status['slots']['free']}/{status['slots']['total']}")
    print(f"{'worker':>6} {'pid':>8} {'gen':>4} {'state':<9} {'restarts':>8}  by reason / last exit")
    for w in status["workers"]:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(w["restarts"].items())) or "-"
        last = w["last_exit"]["reason"] if w["last_exit"] else "-"
        print(f"{w['index']:>6} {w['pid'] or '-':>8} {w['generation']:>4} {w['state']:<9} "
              f"{w['restarts_total']:>8}  {reasons} / {last}")
    print(f"{'model':<16} {'ready':<6} {'state':<11} {'memory MiB':>10} {'queued':>6} {'requeued':>8}")
    for name, m in sorted(status["models"].items()):
        memory = f"{m.get('memory_bytes', 0) / 2**20:.1f}"
        print(f"{name:<16} {str(m['ready']):<6} {m.get('model_state', '-'):<11} {memory:>10} {m['queue_depth']:>6} "
              f"{m['requeued_batches']:>8}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model repository over KServe v2 HTTP")
    serve.add_argument("--model-repository", required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1)
    serve.add_argument("--standby-workers", type=int, default=0,
                       help="hot spares with models loaded: one takes over at once when a worker dies")
    serve.add_argument("--slot-count", type=int, default=8, help="batch slots in the shared-memory ring")
    serve.add_argument("--slot-mb", type=int, default=16, help="bytes per slot (inputs + outputs of one batch)")
    serve.add_argument("--hang-timeout-s", type=float, default=5.0,
                       help="a worker silent this long (no heartbeat) is killed and restarted")
    serve.add_argument("--worker-start-timeout-s", type=float, default=60.0,
                       help="a new worker's first heartbeat may take this long (interpreter start and "
                            "imports on a loaded host); then --hang-timeout-s applies")
    serve.add_argument("--batch-timeout-s", type=float, default=0.0,
                       help="kill a worker whose batch runs longer than this (0 = off)")
    serve.add_argument("--hold-when-unavailable-s", type=float, default=0.0,
                       help="while no worker is ready, hold new requests up to this long instead of 503 (0 = 503)")
    serve.add_argument("--request-timeout-s", type=float, default=30.0)
    serve.add_argument("--max-attempts", type=int, default=2,
                       help="worker deaths a batch may cause before it is bisected")
    serve.add_argument("--drain-timeout-s", type=float, default=30.0,
                       help="on SIGTERM, how long accepted requests may take to finish")
    serve.add_argument("--max-batches-per-worker", type=int, default=0,
                       help="replace a worker (without downtime) after this many batches (0 = never)")
    serve.add_argument("--worker-memory-limit", type=parse_bytes, default=0, metavar="SIZE",
                       help="replace a worker (without downtime) whose RSS passes this, e.g. 2GiB (0 = no limit)")
    serve.add_argument("--runtime-dir", default=None,
                       help="dir for the ZeroMQ sockets (0700); systemd: ${RUNTIME_DIRECTORY}. Default: a temp dir")
    serve.add_argument("--intra-op-threads", type=int, default=0,
                       help="ORT threads per worker (0 = the CPUs less one for the gateway, split across the workers)")
    serve.add_argument("--cpu-only", action="store_true", help="never try the CUDA provider")
    serve.add_argument("--model-memory-budget", type=parse_bytes, default=0, metavar="SIZE",
                       help="memory each worker's loaded models may take, e.g. 2GiB; loads evict the least recently "
                            "used idle models to fit (0 = no budget)")
    serve.add_argument("--gpus", type=parse_gpus, default=(), metavar="IDS",
                       help="CUDA devices for the workers, e.g. 0,1: worker i gets device ids[i %% len(ids)]")
    serve.add_argument("--cuda-arena-extend-strategy", default="", choices=["kNextPowerOfTwo", "kSameAsRequested"],
                       help="ORT CUDA provider option (default: ORT's, kNextPowerOfTwo)")
    serve.add_argument("--cudnn-conv-algo-search", default="", choices=["EXHAUSTIVE", "HEURISTIC", "DEFAULT"],
                       help="ORT CUDA provider option (default: ORT's, EXHAUSTIVE)")
    serve.add_argument("--api-key-file", default=None, metavar="PATH",
                       help="require 'Authorization: Bearer <key>' on inference, model, repository and admin "
                            "routes (the key: this file's content; or set RINGSERVE_API_KEY)")
    serve.add_argument("--api-key-everywhere", action="store_true",
                       help="with an API key, also require it on health, metrics and /openapi.json")
    serve.add_argument("--max-request-bytes", type=parse_bytes, default=None, metavar="SIZE",
                       help="413 for larger request bodies, refused before reading them (default 256MiB)")
    serve.add_argument("--body-timeout-s", type=float, default=None,
                       help="408 when a request body stops arriving for this long (default 30)")
    serve.add_argument("--log-level", default="INFO")
    serve.set_defaults(func=_serve)
    demo = sub.add_parser("demo-models", help="write the demo models (mlp, encoder) into DIR")
    demo.add_argument("directory")
    demo.set_defaults(func=_demo_models)
    status = sub.add_parser("status", help="show workers, restarts and queues of a running server")
    status.add_argument("--url", default="http://127.0.0.1:8000")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
