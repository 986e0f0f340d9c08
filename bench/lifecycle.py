"""`python -m bench.lifecycle`: load and unload one model N times in a real worker; RSS must stay flat.

One `ringserve serve` (one worker, CPU) with an eager model of --weight-mb of weights. Each
cycle: repository unload (the worker drops the session), wait until the worker reports it
unloaded, repository load, wait until it is ready again, one inference. The worker's RSS
is read (psutil) at the start (booted, model loaded and run once) and after the last cycle; both times
the model is loaded, so the difference is what the cycles leaked. Exit status 1 when the
growth passes --max-growth (10 %). The test suite runs it with a lower --cycles.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import psutil
from onnx import TensorProto, helper

from ringserve.common.repository.demo import make_model

MODEL = "cycled"


def build_repository(repo: Path, weight_mb: float) -> int:
    """`<repo>/cycled`: x [batch, n] @ w [n, n] with n*n*4 bytes ~ weight_mb; returns n."""
    n = max(4, int((weight_mb * 2**20 / 4) ** 0.5))
    w = (np.random.default_rng(0).standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])
    model = make_model(MODEL, [helper.make_node("MatMul", ["x", "w"], ["y"])], [x], [y], {"w": w})
    (repo / MODEL / "1").mkdir(parents=True)
    onnx.save(model, str(repo / MODEL / "1" / "model.onnx"))
    (repo / MODEL / "config.json").write_text(json.dumps({"max_batch_size": 8, "model_load_policy": "eager"}))
    return n


class Server:
    """One ringserve process tree on a free port."""

    def __init__(self, repo: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--model-repository", str(repo),
                                         "--port", str(self.port), "--workers", "1", "--cpu-only",
                                         "--grpc-port", "0", "--log-level", "WARNING"])  # (gRPC: not measured here)

    def call(self, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
        data = None if doc is None else json.dumps(doc).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def wait_for(self, predicate, timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ringserve exited with {self.process.returncode} while waiting for {what}")
            try:
                value = predicate()
            except OSError:
                value = None
            if value:
                return value
            time.sleep(0.01)
        raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")

    def model_state(self) -> str:
        """The state the worker reported (the index says `unavailable` while an API unload is in force)."""
        return self.call("GET", "/admin/status")[1]["models"][MODEL]["model_state"]

    def worker_pid(self) -> int:
        return self.call("GET", "/admin/status")[1]["workers"][0]["pid"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def cycle(server: Server, body: dict) -> None:
    for action, state in (("unload", "unloaded"), ("load", "ready")):
        status, doc = server.call("POST", f"/v2/repository/models/{MODEL}/{action}")
        if status != 200:
            raise RuntimeError(f"{action} failed: {status} {doc}")
        server.wait_for(lambda: server.model_state() == state, 30, f"the worker to report {MODEL} {state}")
    status, doc = server.call("POST", f"/v2/models/{MODEL}/infer", body)
    if status != 200:
        raise RuntimeError(f"inference after a load failed: {status} {doc}")


def run(cycles: int = 200, weight_mb: float = 8.0, max_growth: float = 0.10) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ringserve-bench-lifecycle-") as tmp:
        repo = Path(tmp) / "models"
        n = build_repository(repo, weight_mb)
        body = {"inputs": [{"name": "x", "shape": [1, n], "datatype": "FP32", "data": [0.5] * n}]}
        server = Server(repo)
        try:
            server.wait_for(lambda: server.call("GET", "/v2/health/ready")[0] == 200, 60, "ready")
            worker = psutil.Process(server.worker_pid())
            assert server.call("POST", f"/v2/models/{MODEL}/infer", body)[0] == 200
            start = worker.memory_info().rss  # booted, the model loaded and run once
            started = time.perf_counter()
            for i in range(cycles):
                cycle(server, body)
                if i == 0:
                    after_first = worker.memory_info().rss
            elapsed = time.perf_counter() - started
            final = worker.memory_info().rss
            footprint = server.call("GET", "/admin/status")[1]["models"][MODEL]["memory_bytes"]
        finally:
            server.stop()
    growth = (final - start) / start
    return {"cycles": cycles, "weight_mb": weight_mb, "model_footprint_bytes": footprint,
            "worker_rss_start_bytes": start, "worker_rss_after_first_cycle_bytes": after_first,
            "worker_rss_final_bytes": final, "growth": round(growth, 4), "max_growth": max_growth,
            "ok": abs(growth) <= max_growth, "seconds_per_cycle": round(elapsed / cycles, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--weight-mb", type=float, default=8.0, help="weights of the cycled model")
    parser.add_argument("--max-growth", type=float, default=0.10, help="allowed RSS growth (0.10 = 10 %%)")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    result = run(args.cycles, args.weight_mb, args.max_growth)
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
