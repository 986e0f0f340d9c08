"""`python -m gateway`: the HTTP gateway process, spawned by the supervisor."""
from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from pathlib import Path

import uvicorn

from common.config import load_repository
from common.process import configure_logging, die_with_parent

from .app import GatewayApp, GatewaySettings
from .dispatch import DispatchSettings

log = logging.getLogger("gateway")

EXIT_BOOT_ERROR = 3


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gateway")
    p.add_argument("--runtime-dir", required=True)
    p.add_argument("--segment", required=True)
    p.add_argument("--model-repository", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--fd", type=int, default=None, help="listen on this inherited socket fd")
    p.add_argument("--parent-pid", type=int, default=0)
    p.add_argument("--request-timeout-s", type=float, default=30.0)
    p.add_argument("--max-attempts", type=int, default=2)
    p.add_argument("--drain-timeout-s", type=float, default=30.0)
    p.add_argument("--batch-timeout-s", type=float, default=0.0)
    p.add_argument("--hold-when-unavailable-s", type=float, default=0.0)
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


class GatewayServer(uvicorn.Server):
    """uvicorn's server, telling the dispatcher the moment shutdown begins."""

    def __init__(self, config: uvicorn.Config, app: GatewayApp) -> None:
        super().__init__(config)
        self.gateway_app = app

    def handle_exit(self, sig: int, frame: object) -> None:
        # Ready goes false at once; requests already accepted still finish.
        self.gateway_app.dispatcher.draining = True
        super().handle_exit(sig, frame)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging("gateway", args.log_level)
    die_with_parent(args.parent_pid, signal.SIGTERM)
    try:
        configs = load_repository(Path(args.model_repository))
        app = GatewayApp(configs, GatewaySettings(
            runtime_dir=args.runtime_dir, segment_name=args.segment,
            dispatch=DispatchSettings(request_timeout_s=args.request_timeout_s, max_attempts=args.max_attempts,
                                      batch_timeout_s=args.batch_timeout_s,
                                      hold_when_unavailable_s=args.hold_when_unavailable_s)))
    except Exception as exc:
        log.critical("gateway cannot boot: %s", exc)
        return EXIT_BOOT_ERROR
    config = uvicorn.Config(app, host=args.host, port=args.port, fd=args.fd, loop="uvloop", http="httptools",
                            lifespan="on", access_log=False, log_level="warning",
                            timeout_graceful_shutdown=int(args.drain_timeout_s), log_config=None)
    GatewayServer(config, app).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
