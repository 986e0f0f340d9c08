"""`ringserve`: serve, build demo models, show a running server's status."""
from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from common.process import configure_logging


def _serve(args: argparse.Namespace) -> int:
    from supervisor import ServeSettings, Supervisor

    configure_logging("supervisor", args.log_level)
    settings = ServeSettings(
        model_repository=str(Path(args.model_repository).resolve()), host=args.host, port=args.port,
        workers=args.workers, slot_count=args.slot_count, slot_mb=args.slot_mb,
        hang_timeout_s=args.hang_timeout_s, batch_timeout_s=args.batch_timeout_s,
        hold_when_unavailable_s=args.hold_when_unavailable_s, request_timeout_s=args.request_timeout_s,
        max_attempts=args.max_attempts, drain_timeout_s=args.drain_timeout_s,
        intra_op_threads=args.intra_op_threads, cpu_only=args.cpu_only, log_level=args.log_level)
    return Supervisor(settings).run()


def _demo_models(args: argparse.Namespace) -> int:
    from common.demo_models import build_demo_models

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
    print(f"{'model':<16} {'ready':<6} {'queued':>6} {'requeued':>8}")
    for name, m in sorted(status["models"].items()):
        print(f"{name:<16} {str(m['ready']):<6} {m['queue_depth']:>6} {m['requeued_batches']:>8}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model repository over KServe v2 HTTP")
    serve.add_argument("--model-repository", required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1)
    serve.add_argument("--slot-count", type=int, default=8, help="batch slots in the shared-memory ring")
    serve.add_argument("--slot-mb", type=int, default=16, help="bytes per slot (inputs + outputs of one batch)")
    serve.add_argument("--hang-timeout-s", type=float, default=5.0,
                       help="a worker silent this long (no heartbeat) is killed and restarted")
    serve.add_argument("--batch-timeout-s", type=float, default=0.0,
                       help="kill a worker whose batch runs longer than this (0 = off)")
    serve.add_argument("--hold-when-unavailable-s", type=float, default=0.0,
                       help="while no worker is ready, hold new requests up to this long instead of 503 (0 = 503)")
    serve.add_argument("--request-timeout-s", type=float, default=30.0)
    serve.add_argument("--max-attempts", type=int, default=2,
                       help="worker deaths a batch may cause before it is bisected")
    serve.add_argument("--drain-timeout-s", type=float, default=30.0)
    serve.add_argument("--intra-op-threads", type=int, default=1)
    serve.add_argument("--cpu-only", action="store_true", help="never try the CUDA provider")
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
