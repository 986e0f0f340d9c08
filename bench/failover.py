"""`python -m bench.failover`: SIGKILL the serving worker under steady load, with and without a hot standby.

For each kill, measured from the kill: `next_ok_ms`, until the first 200 answer to a request
SENT AFTER the kill (conservative: it includes that request's own latency), and the count of
non-200 answers over the whole run (must be 0 with a standby; 503s while the only worker
restarts are expected without one). Kills are spaced so that each restart is immediate
(no crash-loop backoff). Median and p90 over --kills.
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
import time
import urllib.request
from pathlib import Path

import aiohttp

from ringserve.common.repository.demo import build_demo_models

from .servers import ringserve_service

BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.25] * 512}]}).encode()


def status(url: str) -> dict:
    with urllib.request.urlopen(url + "/admin/status", timeout=5) as r:
        return json.load(r)


def serving_pid(url: str) -> int | None:
    for w in status(url)["workers"]:
        if w["state"] == "ready" and w.get("role", "active") == "active":
            return w["pid"]
    return None


async def measure(url: str, kills: int, spacing_s: float, clients: int, standbys: int) -> dict:
    answers: list[tuple[float, float, int]] = []  # (sent, done, status)
    stop = asyncio.Event()

    async def client(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            async with session.post(url + "/v2/models/mlp/infer", data=BODY,
                                    headers={"content-type": "application/json"}) as r:
                await r.read()
                answers.append((sent, time.monotonic(), r.status))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(clients)]
        next_ok_ms = []
        try:
            await asyncio.sleep(1.0)
            for _ in range(kills):
                pid = await asyncio.to_thread(serving_pid, url)
                while pid is None or len(await asyncio.to_thread(lambda: [w for w in status(url)["workers"]
                                                                          if w["state"] == "ready"])) < 1 + standbys:
                    await asyncio.sleep(0.05)
                    pid = await asyncio.to_thread(serving_pid, url)
                killed_at = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                while True:
                    ok = [done for sent, done, code in answers if sent > killed_at and code == 200]
                    if ok:
                        next_ok_ms.append((min(ok) - killed_at) * 1e3)
                        break
                    await asyncio.sleep(0.001)
                await asyncio.sleep(spacing_s)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    codes: dict[int, int] = {}
    for _, _, code in answers:
        codes[code] = codes.get(code, 0) + 1
    ordered = sorted(next_ok_ms)
    return {"kills": kills, "next_ok_ms": next_ok_ms, "median_ms": statistics.median(ordered),
            "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "answers_by_code": codes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__)
    p.add_argument("--kills", type=int, default=12)
    p.add_argument("--spacing-s", type=float, default=11.0, help="> the supervisor's 10 s stable period")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--out", default="bench/results/failover.json")
    args = p.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="ringserve-failover-") as tmp:
        repo = Path(tmp) / "models"
        build_demo_models(repo)
        for name, standbys in (("standby", 1), ("no standby", 0)):
            service = ringserve_service(name, repo, ["mlp"], log_dir=Path(tmp),
                                        extra_args=["--standby-workers", str(standbys)])
            with service:
                results[name] = asyncio.run(measure(service.url, args.kills, args.spacing_s, args.clients, standbys))
    print("| case | kills | SIGKILL -> next 200 median (ms) | p90 (ms) | answers by code |")
    print("|---|---:|---:|---:|---|")
    for name, r in results.items():
        print(f"| {name} | {r['kills']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | {r['answers_by_code']} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join([sys.executable, "-m", "bench.failover", *sys.argv[1:]]),
                                          "nproc": os.cpu_count(), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
