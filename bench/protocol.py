"""`python -m bench.protocol`: KServe JSON vs the binary tensor extension at 1 MiB tensors.

Two models, both [batch, 262144] FP32 in (1 MiB per row): `sum1m` answers 4 bytes per row
(what the request encoding costs), `echo1m` answers the whole tensor (both directions).
For each model and encoding: closed-loop clients for a fixed time, then requests/s,
latency percentiles and the gateway process's CPU time per request (user + system, from
/proc through psutil). The client runs on the same machine; its CPU is reported too. A
benchmark, not a test: nothing is asserted except that every answer is a 200 and one
sampled answer per run equals the expected values.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnx
import orjson
import psutil
from onnx import TensorProto, helper

ELEMENTS = 1 << 18  # 262144 FP32 = 1 MiB per row
MODELS = ("sum1m", "echo1m")
ENCODINGS = ("json", "binary")
READY_TIMEOUT_S = 120.0


def build_repository(repo: Path) -> None:
    """sum1m: y = ReduceSum(x, axis 1) [batch, 1]; echo1m: y = Identity(x) [batch, 262144]."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graphs = {
        "sum1m": ([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)], [axes], 1),
        "echo1m": ([helper.make_node("Identity", ["x"], ["y"])], [], ELEMENTS),
    }
    for name, (nodes, inits, width) in graphs.items():
        graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", ELEMENTS])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", width])], initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 10  # what every onnxruntime since 1.20 loads (see common/repository/demo.py)
        (repo / name / "1").mkdir(parents=True)
        onnx.save(model, str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.json").write_text(json.dumps({
            "name": name, "max_batch_size": 8, "dynamic_batching": {},
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [ELEMENTS]}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [width]}]}))


def request_body(x: np.ndarray, encoding: str) -> tuple[bytes, dict[str, str]]:
    if encoding == "json":
        doc = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1)}]}
        return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), {"Content-Type": "application/json"}
    header = orjson.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "parameters": {"binary_data_output": True}})
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"}


def decode_output(body: bytes, header_length: str | None) -> np.ndarray:
    if header_length is None:
        out = orjson.loads(body)["outputs"][0]
        return np.asarray(out["data"], np.float32).reshape(out["shape"])
    n = int(header_length)
    out = orjson.loads(body[:n])["outputs"][0]
    return np.frombuffer(body, np.float32, offset=n).reshape(out["shape"])


class Server:
    """`python -m ringserve.cli serve` on a free port, stopped with SIGTERM."""

    def __init__(self, repo: Path, extra_args: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        root = Path(__file__).resolve().parent.parent
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository", str(repo), "--port", str(self.port),
             "--slot-mb", "32", "--max-request-bytes", str(64 << 20), "--log-level", "WARNING", "--grpc-port", "0",
             *extra_args],
            cwd=root)

    def wait_ready(self) -> psutil.Process:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ringserve exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
                    if b" 200 " in sock.recv(1024).split(b"\r\n")[0] + b" ":
                        return next(p for p in psutil.Process(self.process.pid).children()
                                    if "ringserve.gateway" in " ".join(p.cmdline()))
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError("ringserve did not become ready")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


async def run_load(url: str, body: bytes, headers: dict[str, str], concurrency: int, duration_s: float,
                   warmup_s: float) -> tuple[list[float], bytes, str | None]:
    latencies: list[float] = []
    sample: list[Any] = [b"", None]
    errors: list[str] = []
    start = time.monotonic()
    measure_from, stop_at = start + warmup_s, start + warmup_s + duration_s

    async def client(session: aiohttp.ClientSession) -> None:
        while (now := time.monotonic()) < stop_at:
            async with session.post(url, data=body, headers=headers) as response:
                payload = await response.read()
                if response.status != 200:
                    errors.append(f"{response.status}: {payload[:200]!r}")
                    return
            if now >= measure_from:
                latencies.append(time.monotonic() - now)
                sample[0], sample[1] = payload, response.headers.get("Inference-Header-Content-Length")

    connector = aiohttp.TCPConnector(limit=concurrency)
    # aiohttp asks for gzip by default, and the server would spend its CPU compressing floats.
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120),
                                     skip_auto_headers=["Accept-Encoding"]) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, first: {errors[0]}")
    return latencies, sample[0], sample[1]


def measure(server: Server, gateway: psutil.Process, model: str, encoding: str, args: argparse.Namespace) -> dict:
    x = np.random.default_rng(0).standard_normal((1, ELEMENTS)).astype(np.float32)
    body, headers = request_body(x, encoding)
    if args.accept_encoding:
        headers["Accept-Encoding"] = args.accept_encoding
    client = psutil.Process()
    gw0, cl0 = gateway.cpu_times(), client.cpu_times()
    started = time.monotonic()
    latencies, sample, header_length = asyncio.run(run_load(
        f"{server.url}/v2/models/{model}/infer", body, headers, args.concurrency, args.duration_s, args.warmup_s))
    gw1, cl1 = gateway.cpu_times(), client.cpu_times()
    expected = x.sum(axis=1, keepdims=True) if model == "sum1m" else x
    got = decode_output(sample, header_length)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-2)
    # CPU is counted over warm-up + measurement, so divide by every request sent in that time.
    total = len(latencies) * (args.duration_s + args.warmup_s) / args.duration_s
    ms = sorted(1000 * s for s in latencies)
    return {
        "model": model, "encoding": encoding, "request_bytes": len(body), "response_bytes": len(sample),
        "requests": len(latencies), "requests_per_s": len(latencies) / args.duration_s,
        "p50_ms": statistics.median(ms), "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
        "gateway_cpu_ms_per_request": 1000 * _cpu(gw0, gw1) / total,
        "client_cpu_ms_per_request": 1000 * _cpu(cl0, cl1) / total,
        "wall_s": time.monotonic() - started,
    }


def _cpu(before, after) -> float:
    return (after.user + after.system) - (before.user + before.system)


def render(rows: list[dict]) -> str:
    lines = [f"{'model':<8} {'encoding':<8} {'req MiB':>8} {'resp MiB':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'gateway CPU ms/req':>19} {'client CPU ms/req':>18}"]
    for r in rows:
        lines.append(f"{r['model']:<8} {r['encoding']:<8} {r['request_bytes'] / 2**20:>8.2f} "
                     f"{r['response_bytes'] / 2**20:>9.2f} {r['requests_per_s']:>8.1f} {r['p50_ms']:>8.1f} "
                     f"{r['p99_ms']:>8.1f} {r['gateway_cpu_ms_per_request']:>19.2f} "
                     f"{r['client_cpu_ms_per_request']:>18.2f}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration-s", type=float, default=None, help="measured seconds per run (default 5)")
    p.add_argument("--warmup-s", type=float, default=None, help="unmeasured seconds before each run (default 1)")
    p.add_argument("--concurrency", type=int, default=None, help="closed-loop clients (default 4)")
    p.add_argument("--quick", action="store_true", help="for tests: 1 s runs, 0.3 s warm-up, 2 clients "
                                                        "(explicit flags still win)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--cpu-only", action="store_true", help="serve with --cpu-only")
    p.add_argument("--accept-encoding", default="", help="send this Accept-Encoding (e.g. gzip) to measure "
                                                         "response compression too (default: none)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.protocol", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def add_parser(subparsers) -> None:
    """`python -m bench protocol ...`: the hook bench/__main__.py looks for."""
    p = subparsers.add_parser("protocol", help="KServe JSON vs binary tensors at 1 MiB (bench/protocol.py)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=lambda args, argv=None: run(args))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every model x encoding; prints the table and returns the document (also written to --json)."""
    for name, default, quick in (("duration_s", 5.0, 1.0), ("warmup_s", 1.0, 0.3), ("concurrency", 4, 2)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else default)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ringserve-bench-protocol-") as tmp:
        build_repository(Path(tmp))
        server = Server(Path(tmp), ["--cpu-only"] if args.cpu_only else [])
        try:
            gateway = server.wait_ready()
            for model in models:
                for encoding in ENCODINGS:
                    rows.append(measure(server, gateway, model, encoding, args))
                    print(render(rows[-1:]).splitlines()[1], flush=True)
        finally:
            server.stop()
    print()
    print(f"{args.concurrency} clients, {args.duration_s:g} s per run, {os.cpu_count()} CPUs, "
          f"Accept-Encoding: {args.accept_encoding or 'none'}")
    print(render(rows))
    document = {"suite": "protocol", "concurrency": args.concurrency, "duration_s": args.duration_s,
                "warmup_s": args.warmup_s, "accept_encoding": args.accept_encoding, "rows": rows}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return document


def main(argv: list[str] | None = None) -> int:
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
