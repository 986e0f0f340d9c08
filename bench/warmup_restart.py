"""`python -m bench.warmup_restart`: the first 100 requests after a SIGKILL of the worker, with and without warm-up.

The model is a Python model whose first execute in a process sleeps --first-run-s (a cold first run:
a JIT, a lazily built engine, caches filled on first use), then doubles its input. Served twice, each
alone: once plain, once with Triton's `model_warmup` (one sample, batch_size 1, zeros). For each of
--kills kills: the serving worker is SIGKILLed, the server is waited for until /v2/health/ready says 200
with a new worker (what a load balancer's probe waits for: `restart_s`), then 100 requests go out at
--clients at a time, and their latencies are taken. Per case: the median over the kills of each kill's
p50, p99 and max of those 100, and of restart_s (warm-up moves the cold run into the restart).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import aiohttp

from .servers import ringserve_service

MODEL_PY = """
import time

import triton_python_backend_utils as pb_utils

FIRST_RUN_S = {first_run_s}


class TritonPythonModel:
    def initialize(self, args):
        self.cold = True

    def execute(self, requests):
        if self.cold:
            self.cold = False
            time.sleep(FIRST_RUN_S)
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * x)]) for x in xs]
"""
CONFIG = """\
name: "slow_first"
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { }
"""
WARMUP = """\
model_warmup [ { name: "zeros" batch_size: 1
                 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
"""
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}).encode()


def build(repo: Path, first_run_s: float, warm: bool) -> None:
    (repo / "slow_first" / "1").mkdir(parents=True)
    (repo / "slow_first" / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY.format(first_run_s=first_run_s)))
    (repo / "slow_first" / "config.pbtxt").write_text(CONFIG + (WARMUP if warm else ""))


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, {}
    except OSError:
        return 0, {}


def worker_pid(url: str) -> int | None:
    status, doc = get(url + "/admin/status")
    ready = [w["pid"] for w in doc.get("workers", ()) if w.get("state") == "ready"] if status == 200 else []
    return ready[0] if ready else None


async def first_requests(url: str, count: int, clients: int) -> list[float]:
    latencies: list[float] = []
    left = iter(range(count))

    async def client(session: aiohttp.ClientSession) -> None:
        for _ in left:
            sent = time.perf_counter()
            async with session.post(url + "/v2/models/slow_first/infer", data=BODY,
                                    headers={"content-type": "application/json"}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"answer {r.status}")
            latencies.append(time.perf_counter() - sent)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(url: str, kills: int, requests: int, clients: int) -> dict:
    runs = []
    for _ in range(kills):
        pid = None
        while pid is None:
            pid = worker_pid(url)
            time.sleep(0.05)
        asyncio.run(first_requests(url, 10, 1))  # the old worker has had its cold run
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        while not (get(url + "/v2/health/ready")[0] == 200 and worker_pid(url) not in (None, pid)):
            time.sleep(0.01)
        restart_s = time.monotonic() - killed
        latencies = asyncio.run(first_requests(url, requests, clients))
        runs.append({"restart_s": restart_s, "p50_ms": percentile(latencies, 0.5) * 1e3,
                     "p99_ms": percentile(latencies, 0.99) * 1e3, "max_ms": max(latencies) * 1e3})
        time.sleep(11.0)  # past the supervisor's 10 s stable period: the next restart is immediate
    return {"runs": runs, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.warmup_restart", description=__doc__)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--first-run-s", type=float, default=1.0)
    p.add_argument("--out", default="bench/results/warmup_restart.json")
    args = p.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="ringserve-warmup-") as tmp:
        for name, warm in (("no warm-up", False), ("model_warmup", True)):
            repo = Path(tmp) / name.replace(" ", "-")
            build(repo, args.first_run_s, warm)
            with ringserve_service(name, repo, ["slow_first"], log_dir=Path(tmp)) as service:
                results[name] = measure(service.url, args.kills, args.requests, args.clients)
    print(f"| case | kills | restart to ready (s) | first {args.requests}: p50 (ms) | p99 (ms) | max (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {args.kills} | {r['restart_s']:.2f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['max_ms']:.1f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    command = " ".join([sys.executable, "-m", "bench.warmup_restart", *(argv if argv is not None else sys.argv[1:])])
    Path(args.out).write_text(json.dumps({"command": command, "nproc": os.cpu_count(), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
