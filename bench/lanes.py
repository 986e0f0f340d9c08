"""`python -m bench lanes`: many models on one server. A fast model beside saturated slow ones, and
instance_group's count, with lanes (each model its own worker processes, the default) and without
(`--lanes shared`: every worker holds every model), side by side in one invocation.

Cases:
  fast alone        the demo `mlp` at --clients (default 4) closed-loop clients, nothing else running
  beside <slow>     the same while 8 clients keep a slow model saturated:
                      sleep    a Python model whose execute sleeps 100 ms (the GIL released)
                      gil      a Python model whose execute computes 50 ms in Python (the GIL held)
                      onnx     an ONNX model of 3 x 2048-wide layers at batch 64 (~tens of ms a batch)
  count N           a Python model sleeping 100 ms (and one computing 50 ms) with instance_group count
                    1, 2, 4: requests/s at 8 clients, as a ratio to count 1 (ideal: N for the sleeping one;
                    for the computing one, at most the cores)
Memory: RSS and USS of each worker process (lane) after the runs.
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.report import new_document, render_table
from bench.servers import ringserve_service
from bench.suite import add_common_arguments, command_line, resolve_common, running, workspace, write_outputs

log = logging.getLogger(__name__)

NAME = "lanes"
DEFAULTS = {"duration_s": 5.0, "warmup_s": 1.0, "repeats": 3, "concurrency": [4]}
QUICK = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "concurrency": [2]}

SLEEP_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        {body}
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(1, np.float32))]) for _ in requests]
"""
BODIES = {
    "sleep": "time.sleep(0.1)",
    "gil": "end = time.perf_counter() + 0.05\n        while time.perf_counter() < end:\n            pass",
}
MLP_DOC = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 512], "data": [0.5] * 512}]}
PY_DOC = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
WIDE_DOC = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2048], "data": [0.5] * 2048}]}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="a fast model beside saturated slow ones, and instance_group counts, "
                                         "with lanes and --lanes shared", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=None, help="clients on the fast model (default 4)")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def python_model(repo: Path, name: str, body: str, count: int | None = None) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(SLEEP_PY.replace("{body}", body))
    config: dict[str, Any] = {"backend": "python", "max_batch_size": 0,
                              "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
                              "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}]}
    if count:
        config["instance_group"] = [{"kind": "KIND_CPU", "count": count}]
    (repo / name / "config.json").write_text(json.dumps(config))


def wide_onnx(repo: Path) -> None:
    from onnx import TensorProto, helper

    from ringserve.common.repository.demo import make_model, write_model_dir

    rng = np.random.default_rng(0)
    weights = {f"w{i}": (rng.standard_normal((2048, 2048)) / 45).astype(np.float32) for i in range(3)}
    nodes, last = [], "x"
    for i in range(3):
        nodes.append(helper.make_node("MatMul", [last, f"w{i}"], [f"h{i}"]))
        last = f"h{i}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2048])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2048])
    write_model_dir(repo, "wide", make_model("wide", nodes, [x], [y], weights),
                    {"max_batch_size": 64, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2048]}],
                     "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2048]}], "dynamic_batching": {}})


async def closed_loop(url: str, model: str, doc: dict, clients: int, seconds: float) -> list[float]:
    import aiohttp

    body = json.dumps(doc)
    latencies: list[float] = []

    async def client(session: aiohttp.ClientSession, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            async with session.post(f"{url}/v2/models/{model}/infer", data=body) as response:
                await response.read()
            latencies.append(time.perf_counter() - started)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        stop_at = time.monotonic() + seconds
        await asyncio.gather(*[client(session, stop_at) for _ in range(clients)])
    return latencies


async def beside(url: str, clients: int, seconds: float, slow: tuple[str, dict] | None) -> list[float]:
    """The fast model's latencies while `slow` (model, body) is kept busy by 8 clients."""
    if slow is None:
        return await closed_loop(url, "mlp", MLP_DOC, clients, seconds)
    busy = asyncio.create_task(closed_loop(url, slow[0], slow[1], 8, seconds + 1.0))
    await asyncio.sleep(0.5)
    fast = await closed_loop(url, "mlp", MLP_DOC, clients, seconds)
    await busy
    return fast


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return 1e3 * values[min(len(values) - 1, int(len(values) * q))]


def lane_memory(service) -> list[dict[str, Any]]:
    rows = []
    for child in psutil.Process(service.process.pid).children(recursive=True):
        try:
            if "ringserve.worker" in " ".join(child.cmdline()) and "--spare-device" not in child.cmdline():
                info = child.memory_full_info()
                rows.append({"pid": child.pid, "rss_mib": info.rss / 2**20, "uss_mib": info.uss / 2**20})
        except psutil.Error:
            continue
    return rows


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    settings = resolve_common(args, DEFAULTS, QUICK)
    clients = args.clients or (QUICK if settings.quick else DEFAULTS)["concurrency"][0]
    document = new_document(NAME, "Many models: a fast one beside slow ones; instance_group counts",
                            command_line(argv), {"clients": clients})
    rows, counts = [], []
    with workspace(NAME) as tmp:
        from ringserve.common.repository.demo import build_demo_models

        repo = tmp / "repo"
        build_demo_models(repo)
        for name, body in BODIES.items():
            python_model(repo, name, body)
        wide_onnx(repo)
        services = {layout: ringserve_service(f"ringserve_{layout}", repo, ["mlp", "sleep", "gil", "wide"],
                                              log_dir=tmp / f"logs-{layout}", extra_args=["--lanes", layout],
                                              description=f"ringserve --lanes {layout}")
                    for layout in ("model", "shared")}
        cases = [("alone", None), ("sleep", ("sleep", PY_DOC)), ("gil", ("gil", PY_DOC)), ("onnx", ("wide", WIDE_DOC))]
        results: dict[tuple[str, str], list[list[float]]] = {}
        for layout, service in services.items():  # one server at a time: each gets the machine to itself
            with running([service], settings, document):
                for repeat in range(settings.repeats):
                    for case, slow in cases:
                        lat = asyncio.run(beside(service.url, clients, settings.duration_s, slow))
                        results.setdefault((layout, case), []).append(lat)
                document.setdefault("memory", {})[layout] = lane_memory(service)
        for layout in services:
            for case, _ in cases:
                runs = results[(layout, case)]
                p50 = statistics.median(percentile(r, 0.5) for r in runs)
                p99 = statistics.median(percentile(r, 0.99) for r in runs)
                rows.append({"lanes": layout, "case": case, "p50_ms": p50, "p99_ms": p99})
        alone = {r["lanes"]: r["p50_ms"] for r in rows if r["case"] == "alone"}
        for row in rows:
            row["p50_over_alone_ms"] = row["p50_ms"] - alone[row["lanes"]]
        for body in ("sleep", "gil"):
            base = None
            for count in (1, 2, 4):
                count_repo = tmp / f"count-{body}-{count}"
                python_model(count_repo, "m", BODIES[body], count)
                service = ringserve_service(f"count_{body}_{count}", count_repo, ["m"], log_dir=tmp / "logs-count",
                                            extra_args=["--lanes", "model"],
                                            description=f"{body} model, instance_group count {count}")
                with running([service], settings, document):
                    rates = []
                    for _ in range(settings.repeats):
                        lat = asyncio.run(closed_loop(service.url, "m", PY_DOC, 8, settings.duration_s))
                        rates.append(len(lat) / settings.duration_s)
                rate = statistics.median(rates)
                base = base or rate
                counts.append({"model": body, "count": count, "req_s": rate, "vs_count_1": rate / base,
                               "ideal": count if body == "sleep" else min(count, psutil.cpu_count())})
        document["summary"] = rows
        document["counts"] = counts
    memory = "\n".join(
        f"- `--lanes {layout}`: " + ", ".join(f"pid {m['pid']}: RSS {m['rss_mib']:.0f} MiB, USS {m['uss_mib']:.0f} MiB"
                                              for m in mems)
        for layout, mems in document.get("memory", {}).items()
    )
    markdown = (
        render_table(rows, [("lanes", "lanes", None), ("fast model (mlp)", "case", None), ("p50 ms", "p50_ms", 2),
                            ("p99 ms", "p99_ms", 2), ("p50 over alone, ms", "p50_over_alone_ms", 2)])
        + "\n\n"
        + render_table(counts, [("model", "model", None), ("instance_group count", "count", 0), ("req/s", "req_s", 1),
                                ("× count 1", "vs_count_1", 2), ("ideal", "ideal", 0)])
        + "\n\nMemory of each worker process (lane) after the runs:\n" + memory + "\n"
    )
    write_outputs(document, settings, markdown)
    return document
