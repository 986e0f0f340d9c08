"""`python -m gateway`: the HTTP gateway process, spawned by the supervisor."""
from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
from pathlib import Path

import uvicorn

from ringserve.common.config import scan_repository
from ringserve.common.process import configure_logging, die_with_parent

from .app import GatewayApp, GatewaySettings
from .dispatch import DispatchSettings
from .http import UVICORN_OPTIONS

log = logging.getLogger("ringserve.gateway")

EXIT_BOOT_ERROR = 3
# The supervisor passes these through the environment its children inherit (cli.py sets them).
ENV_API_KEY = "RINGSERVE_API_KEY"
ENV_API_KEY_FILE = "RINGSERVE_API_KEY_FILE"
ENV_API_KEY_EVERYWHERE = "RINGSERVE_API_KEY_EVERYWHERE"
ENV_MAX_REQUEST_BYTES = "RINGSERVE_MAX_REQUEST_BYTES"
ENV_BODY_TIMEOUT_S = "RINGSERVE_BODY_TIMEOUT_S"


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
    p.add_argument("--active-workers", type=int, default=0, help="0: every ready worker serves; N: the rest stand by")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--max-request-bytes", type=int, default=int(os.environ.get(ENV_MAX_REQUEST_BYTES, 256 << 20)),
                   help=f"413 for larger request bodies, before reading them (env {ENV_MAX_REQUEST_BYTES})")
    p.add_argument("--body-timeout-s", type=float, default=float(os.environ.get(ENV_BODY_TIMEOUT_S, 30.0)),
                   help=f"408 when a request body pauses this long (env {ENV_BODY_TIMEOUT_S})")
    p.add_argument("--api-key-file", default=os.environ.get(ENV_API_KEY_FILE),
                   help=f"require 'Authorization: Bearer <the file's content>' (env {ENV_API_KEY_FILE}, "
                        f"or the key itself in {ENV_API_KEY})")
    p.add_argument("--api-key-everywhere", action="store_true", default=os.environ.get(ENV_API_KEY_EVERYWHERE) == "1",
                   help="also require the key on health, metrics and /openapi.json")
    return p.parse_args(argv)


def read_api_key(path: str | None) -> str | None:
    """The key from --api-key-file, else from $RINGSERVE_API_KEY, else None (no key needed)."""
    if path:
        key = Path(path).read_text().strip()
        if not key:
            raise ValueError(f"the API key file {path} is empty")
        return key
    return os.environ.get(ENV_API_KEY) or None


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
        scan = scan_repository(Path(args.model_repository))  # a broken model is reported, not fatal
        app = GatewayApp(scan.defaults(), GatewaySettings(
            runtime_dir=args.runtime_dir, segment_name=args.segment,
            dispatch=DispatchSettings(request_timeout_s=args.request_timeout_s, max_attempts=args.max_attempts,
                                      batch_timeout_s=args.batch_timeout_s,
                                      hold_when_unavailable_s=args.hold_when_unavailable_s,
                                      active_workers=args.active_workers, max_inflight_per_worker=2,
                                      retry_after_s=1, quarantine_poison_requests=3, quarantine_window_s=60.0),
            max_body_bytes=args.max_request_bytes, body_timeout_s=args.body_timeout_s,
            model_repository=args.model_repository, api_key=read_api_key(args.api_key_file),
            api_key_everywhere=args.api_key_everywhere))
        app.dispatcher.catalog.add_repository(scan)  # the other versions, and the models that failed
    except Exception as exc:
        log.critical("gateway cannot boot: %s", exc)
        return EXIT_BOOT_ERROR
    config = uvicorn.Config(app, host=args.host, port=args.port, fd=args.fd, **UVICORN_OPTIONS,
                            timeout_graceful_shutdown=int(args.drain_timeout_s), log_config=None)
    # The infer path allocates and frees many small containers per request; with CPython's
    # default gen-0 threshold (700) the collector ran dozens of times a second under load and took
    # 3 % of the gateway's CPU, scanning the boot-time objects (imports, configs) each time.
    # Those are frozen out of collection, and gen 0 waits for 10,000 net allocations.
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    GatewayServer(config, app).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
