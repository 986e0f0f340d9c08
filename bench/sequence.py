"""`python -m bench sequence`: stateful sequences (Triton's sequence batcher) beside stateless batching.

Cases, per state size (`--state-kib`, default 1 and 1024: 1 KiB and 1 MiB of FP32 state per sequence),
every server up for the whole invocation, runs interleaved with the order rotating each repeat:
  sequence   `seq_<k>`: the state model (STATE_MODEL below) with Oldest sequence batching, 64 candidate
             slots; N closed-loop clients, each stepping its own sequence (START, steps, END, again):
             the state stays in the server, in shared memory, and goes through the slot each step
  stateless  `plain_<k>`: the same graph with the state as a constant, dynamic batching, the same
             requests without sequence parameters: what batching costs without state
  batch1     `seq1_<k>`: the sequence model with max_batch_size 1: every step its own execution
  ceiling    ONNX Runtime in this process, one thread, the sequence model at the batch size the
             sequence case formed, carrying the state by hand (no server): the most a step can cost less

Reported: steps/s (median), mean batch size (the server's statistics: inferences per execution),
p50/p99 latency, and the ratios the issue asks for: sequence/stateless steps/s and mean batch size.
Bytes a step copies, from the code (gateway/batching/steps.py): the state once from the store into the
slot and once back, 2 x state bytes, through no Python object; the request's own input as any request.
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import new_document, render_table
from bench.servers import ringserve_service
from bench.suite import add_common_arguments, command_line, resolve_common, running, workspace, write_outputs

log = logging.getLogger(__name__)

NAME = "sequence"
DEFAULTS = {"duration_s": 6.0, "warmup_s": 1.0, "repeats": 3, "concurrency": [64]}
QUICK = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "concurrency": [8]}
STEPS_PER_SEQUENCE = 20
_ID_RANGES = (itertools.count(start) for start in itertools.count(1, 1 << 40))


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="stateful sequences vs stateless batching, batch-1 and the ceiling",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-kib", default="1,1024", help="state sizes per sequence in KiB (default 1,1024)")
    p.add_argument("--clients", type=int, default=None, help="concurrent sequences (default 64; --quick 8)")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def build_model(repo: Path, name: str, width: int, *, sequence: bool, max_batch_size: int = 64) -> None:
    """STATE_MODEL: OUTPUT_STATE = INPUT_STATE * (1 - START) + INPUT (broadcast over the state's width),
    OUTPUT = OUTPUT_STATE[:, :1]. Stateless: the same graph with INPUT_STATE a constant of zeros."""
    from onnx import TensorProto, helper

    from ringserve.common.repository.demo import make_model, write_model_dir

    inputs = [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["b", 1])]
    weights: dict[str, np.ndarray] = {"one": np.array(1, np.float32), "first": np.array([0], np.int64),
                                      "second": np.array([1], np.int64), "axis": np.array([1], np.int64)}
    if sequence:
        inputs += [helper.make_tensor_value_info("INPUT_STATE", TensorProto.FLOAT, ["b", width]),
                   helper.make_tensor_value_info("START", TensorProto.FLOAT, ["b", 1])]
    else:
        weights["INPUT_STATE"] = np.zeros((1, width), np.float32)
        weights["START"] = np.zeros((1, 1), np.float32)
    outputs = [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["b", 1])]
    if sequence:
        outputs.append(helper.make_tensor_value_info("OUTPUT_STATE", TensorProto.FLOAT, ["b", width]))
    nodes = [
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["INPUT_STATE", "keep"], ["carried"]),
        helper.make_node("Add", ["carried", "INPUT"], ["OUTPUT_STATE"] if sequence else ["state"]),
        helper.make_node("Slice", ["OUTPUT_STATE" if sequence else "state", "first", "second", "axis"], ["OUTPUT"]),
    ]
    config: dict[str, Any] = {
        "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    if sequence:
        config["sequence_batching"] = {
            "max_sequence_idle_microseconds": 60_000_000,
            "oldest": {"max_candidate_sequences": 64, "preferred_batch_size": [max_batch_size]},
            "control_input": [{"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START",
                                                             "fp32_false_true": [0, 1]}]}],
            "state": [{"input_name": "INPUT_STATE", "output_name": "OUTPUT_STATE", "data_type": "TYPE_FP32",
                       "dims": [width]}],
        }
    else:
        config["dynamic_batching"] = {}
    write_model_dir(repo, name, make_model(name, nodes, inputs, outputs, weights), config)


async def drive(url: str, model: str, clients: int, seconds: float, warmup_s: float, sequence: bool
                ) -> dict[str, Any]:
    """Closed loop: `clients` clients, each stepping sequences of STEPS_PER_SEQUENCE steps (or plain requests)."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    ids = next(_ID_RANGES)  # (every run its own sequence ids)
    measuring = {"on": False}

    async def client(session: aiohttp.ClientSession, stop_at: float) -> None:
        nonlocal errors
        key, step = next(ids), 0
        while time.monotonic() < stop_at:
            body: dict[str, Any] = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
            if sequence:
                body["parameters"] = {"sequence_id": key, "sequence_start": step == 0,
                                      "sequence_end": step == STEPS_PER_SEQUENCE - 1}
            started = time.perf_counter()
            async with session.post(f"{url}/v2/models/{model}/infer", data=json.dumps(body)) as response:
                await response.read()
                ok = response.status == 200
            if measuring["on"]:
                latencies.append(time.perf_counter() - started)
                errors += not ok
            step += 1
            if step == STEPS_PER_SEQUENCE:
                key, step = next(ids), 0
        if sequence and step:  # the sequence ends, unmeasured: it must not hold a candidate slot into the next run
            body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}],
                    "parameters": {"sequence_id": key, "sequence_end": True}}
            async with session.post(f"{url}/v2/models/{model}/infer", data=json.dumps(body)) as response:
                await response.read()

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        stop_at = time.monotonic() + warmup_s + seconds
        tasks = [asyncio.create_task(client(session, stop_at)) for _ in range(clients)]
        await asyncio.sleep(warmup_s)
        measuring["on"] = True
        started = time.monotonic()
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
    latencies.sort()
    return {"steps_s": len(latencies) / elapsed, "errors": errors,
            "p50_ms": 1e3 * latencies[len(latencies) // 2] if latencies else None,
            "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)] if latencies else None}


def statistics_of(url: str, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) from Triton's statistics extension."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=10) as response:
        stats = json.loads(response.read())["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def ceiling(path: Path, width: int, batch: int, seconds: float) -> float:
    """Steps/s of one ONNX Runtime thread running the sequence model at `batch` rows, state carried by hand."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    state = np.zeros((batch, width), np.float32)
    feeds = {"INPUT": np.ones((batch, 1), np.float32), "START": np.zeros((batch, 1), np.float32)}
    runs, stop_at = 0, time.monotonic() + seconds
    started = time.monotonic()
    while time.monotonic() < stop_at:
        _, state = session.run(["OUTPUT", "OUTPUT_STATE"], {**feeds, "INPUT_STATE": state})
        runs += 1
    return runs * batch / (time.monotonic() - started)


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    settings = resolve_common(args, DEFAULTS, QUICK)
    clients = args.clients or (QUICK if settings.quick else DEFAULTS)["concurrency"][0]
    sizes = [int(k) for k in args.state_kib.split(",")]
    document = new_document(NAME, "Stateful sequences vs stateless batching", command_line(argv),
                            {"clients": clients, "state_kib": sizes, "steps_per_sequence": STEPS_PER_SEQUENCE})
    with workspace(NAME) as tmp:
        repo = tmp / "repo"
        models = []
        for kib in sizes:
            width = kib * 256
            build_model(repo, f"seq_{kib}", width, sequence=True)
            build_model(repo, f"plain_{kib}", width, sequence=False)
            build_model(repo, f"seq1_{kib}", width, sequence=True, max_batch_size=1)
            models += [f"seq_{kib}", f"plain_{kib}", f"seq1_{kib}"]
        # A step takes its state twice in a slot (in and out): 64 MiB slots hold 1 MiB states at batch ~30.
        slot_mb = ["--slot-mb", "64", "--slot-count", "4"] if max(sizes) >= 256 else []
        service = ringserve_service("ringserve", repo, models, log_dir=tmp / "logs", workers=settings.workers,
                                    intra_op_threads=settings.intra_op_threads, extra_args=slot_mb,
                                    description="ringserve serving the sequence and stateless models")
        runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
        with running([service], settings, document):
            for repeat in range(settings.repeats):
                order = ["sequence", "stateless", "batch1"]
                order = order[repeat % 3:] + order[:repeat % 3]
                for kib in sizes:
                    for case in order:
                        model = {"sequence": f"seq_{kib}", "stateless": f"plain_{kib}", "batch1": f"seq1_{kib}"}[case]
                        before = statistics_of(service.url, model)
                        result = asyncio.run(drive(service.url, model, clients, settings.duration_s,
                                                   settings.warmup_s, case != "stateless"))
                        after = statistics_of(service.url, model)
                        executions = after[1] - before[1]
                        result["mean_batch"] = (after[0] - before[0]) / executions if executions else None
                        runs.setdefault((kib, case), []).append(result)
                        document["runs"].append({"state_kib": kib, "case": case, "repeat": repeat, **result})
        rows = []
        for kib in sizes:
            summary = {case: _median(runs[(kib, case)]) for case in ("sequence", "stateless", "batch1")}
            batch = max(1, round(summary["sequence"]["mean_batch"] or 1))
            top = ceiling(repo / f"seq_{kib}" / "1" / "model.onnx", kib * 256, batch, max(settings.duration_s, 1.0))
            for case, row in summary.items():
                rows.append({"state": f"{kib} KiB", "case": case, **row,
                             "vs_stateless": row["steps_s"] / summary["stateless"]["steps_s"],
                             "batch_vs_stateless": (row["mean_batch"] or 0) / (summary["stateless"]["mean_batch"] or 1),
                             "bytes_copied": 2 * kib * 1024 if case != "stateless" else 0})
            rows.append({"state": f"{kib} KiB", "case": f"ceiling (ORT in-process, batch {batch})", "steps_s": top,
                         "vs_stateless": top / summary["stateless"]["steps_s"]})
        document["summary"] = rows
    columns = [("state", "state", None), ("case", "case", None), ("steps/s", "steps_s", 0),
               ("× stateless", "vs_stateless", 2), ("mean batch", "mean_batch", 1),
               ("batch × stateless", "batch_vs_stateless", 2), ("p50 ms", "p50_ms", 2), ("p99 ms", "p99_ms", 2),
               ("errors", "errors", 0), ("state bytes copied/step", "bytes_copied", 0)]
    markdown = render_table(rows, columns) + "\n"
    write_outputs(document, settings, markdown)
    return document


def _median(results: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("steps_s", "p50_ms", "p99_ms", "mean_batch")
    row = {k: statistics.median([r[k] for r in results if r.get(k) is not None] or [0]) for k in keys}
    row["errors"] = sum(r["errors"] for r in results)
    return row
