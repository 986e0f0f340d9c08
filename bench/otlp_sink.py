"""An OTLP/HTTP sink for the tracing-on case (`python -m bench mlp --otel`): takes every export, answers 200.

It runs as a process of its own (`python -m bench.otlp_sink`), not a thread of the bench: the load
generator must not share a GIL with it. It counts what arrived (exports, bytes, spans when
opentelemetry-proto is installed) and writes that as JSON on SIGTERM, so the report shows that the
server did trace (and how many spans its exporters kept up with).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STOP_TIMEOUT_S = 10.0


def serve(port: int, summary_path: Path) -> None:
    try:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError:  # bytes and exports are still counted
        ExportTraceServiceRequest = None  # noqa: N806
    counts = {"exports": 0, "bytes": 0, "spans": None if ExportTraceServiceRequest is None else 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a collector offers

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            spans = 0
            if ExportTraceServiceRequest is not None and self.headers.get("content-encoding") in (None, "identity"):
                export = ExportTraceServiceRequest.FromString(body)
                spans = sum(len(ss.spans) for rs in export.resource_spans for ss in rs.scope_spans)
            with lock:
                counts["exports"] += 1
                counts["bytes"] += len(body)
                if counts["spans"] is not None:
                    counts["spans"] += spans
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()
    with lock:
        summary_path.write_text(json.dumps(counts))


@contextlib.contextmanager
def otlp_sink(tmp: Path) -> Iterator[dict[str, Any]]:
    """A running sink: yields {"endpoint": URL}; once stopped, the dict holds what it received."""
    summary = tmp / "otlp-sink.json"
    process = subprocess.Popen([sys.executable, "-m", "bench.otlp_sink", "--port", "0", "--summary", str(summary)],
                               stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    info: dict[str, Any] = {}
    try:
        port = int(process.stdout.readline().split()[1])  # its first line, once it listens
        info["endpoint"] = f"http://127.0.0.1:{port}"
        yield info
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    deadline = time.monotonic() + 1.0
    while not summary.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    if summary.exists():
        info.update(json.loads(summary.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.otlp_sink")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--summary", type=Path, required=True, help="where the counts go, as JSON, at SIGTERM")
    args = parser.parse_args()
    serve(args.port, args.summary)


if __name__ == "__main__":
    main()
