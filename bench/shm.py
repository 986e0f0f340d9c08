"""`python -m bench shm`: Triton's system shared-memory extension vs the binary HTTP tensors, side by side.

One client (`tritonclient.http`, as a Triton user runs it) sends a 1 MiB and a 16 MiB FP32 input to
`double` (y = 2x, built here: the model costs next to nothing, so the transport is what is measured)
and reads the output of the same size back, in two ways:
  binary  the input in the request body, the output in the response body (binary tensor extension)
  shm     the input in a registered region, the output written into another (shared-memory extension):
          the gateway copies the input from the client's segment into the ring slot, the worker runs on
          the slot, the gateway copies the output from the slot into the client's segment; the HTTP
          request and answer are ~300 bytes of JSON
Each request's round trip is timed on the client; the shm round trip includes reading the result out
of the region as a numpy array (a view: `get_contents_as_numpy`), the binary one decoding the answer.
The modes alternate request by request, so that a noisy machine disturbs both alike; medians and
p90 per size and mode, and the ratio binary/shm. Every answer is checked (2x) once per mode and size.
"""
from __future__ import annotations

import argparse
import logging
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.load import median, percentile
from bench.report import new_document, render_table
from bench.servers import ringserve_service
from bench.suite import add_common_arguments, command_line, pick, resolve_common, running, workspace, write_outputs

log = logging.getLogger(__name__)

NAME = "shm"
MODEL = "double"
SIZES_MIB = (1, 16)
DEFAULTS = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "requests": 40}  # (requests, not seconds)
QUICK = {"requests": 3}
COLUMNS = [("size", "size", None), ("mode", "mode", None), ("requests", "requests", 0),
           ("p50 ms", "p50_ms", 2), ("p90 ms", "p90_ms", 2), ("MiB/s (p50)", "mib_per_s", 0),
           ("binary p50 / this p50", "speedup", 2)]


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="system shared memory vs binary HTTP tensors, 1 MiB and 16 MiB",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=None,
                   help=f"timed requests per size and mode (default {DEFAULTS['requests']})")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def build_double_model(repo: Path, name: str = MODEL) -> None:
    """y = 2x over FP32 [-1] (max_batch_size 0: one request, any length): the cheapest model of a big tensor."""
    from onnx import TensorProto, helper

    from ringserve.common.repository.demo import DEMO_IR_VERSION, DEMO_OPSET, write_model_dir

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], name, [x], [y], initializer=[two])
    model = helper.make_model(graph, producer_name="ringserve.bench",
                              opset_imports=[helper.make_opsetid("", DEMO_OPSET)])
    model.ir_version = DEMO_IR_VERSION
    write_model_dir(repo, name, model, {
        "name": name, "platform": "onnxruntime_onnx", "max_batch_size": 0,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1]}]})


class ShmClient:
    """One size's regions, registered with the server; destroyed (unlinked) by close()."""

    def __init__(self, client, nbytes: int) -> None:
        import tritonclient.utils.shared_memory as shm
        self.shm, self.client, self.nbytes = shm, client, nbytes
        tag = secrets.token_hex(4)
        self.names = (f"bench-in-{tag}", f"bench-out-{tag}")
        self.handles = [shm.create_shared_memory_region(name, f"/{name}", nbytes) for name in self.names]
        for name in self.names:
            client.register_system_shared_memory(name, f"/{name}", nbytes)

    def infer(self, x: np.ndarray) -> np.ndarray:
        import tritonclient.http as triton
        self.shm.set_shared_memory_region(self.handles[0], [x])
        tensor = triton.InferInput("x", list(x.shape), "FP32")
        tensor.set_shared_memory(self.names[0], x.nbytes)
        output = triton.InferRequestedOutput("y")
        output.set_shared_memory(self.names[1], x.nbytes)
        self.client.infer(MODEL, [tensor], outputs=[output])
        return self.shm.get_contents_as_numpy(self.handles[1], np.float32, list(x.shape))

    def close(self) -> None:
        for name in self.names:
            self.client.unregister_system_shared_memory(name)
        for handle in self.handles:
            self.shm.destroy_shared_memory_region(handle)


def binary_infer(client, x: np.ndarray) -> np.ndarray:
    import tritonclient.http as triton
    tensor = triton.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    return client.infer(MODEL, [tensor], outputs=[triton.InferRequestedOutput("y", binary_data=True)]).as_numpy("y")


def measure(client, size_mib: int, requests: int) -> list[dict[str, Any]]:
    """Alternate binary and shm requests of one size; one row per mode."""
    x = np.random.default_rng(size_mib).standard_normal(size_mib * (1 << 20) // 4).astype(np.float32)
    regions = ShmClient(client, x.nbytes)
    try:
        modes = {"binary": lambda: binary_infer(client, x), "shm": lambda: regions.infer(x)}
        for mode, call in modes.items():  # warm, and check the answer once
            if not np.array_equal(call(), 2 * x):
                raise AssertionError(f"{mode} {size_mib} MiB: the answer is not 2x")
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(requests):
            for mode, call in modes.items():
                t = time.perf_counter()
                call()
                times[mode].append(time.perf_counter() - t)
    finally:
        regions.close()
    rows = []
    for mode, values in times.items():
        p50 = median(values)
        rows.append({"size": f"{size_mib} MiB", "size_mib": size_mib, "mode": mode, "requests": len(values),
                     "p50_ms": p50 * 1e3, "p90_ms": percentile(values, 90) * 1e3, "mib_per_s": size_mib / p50})
    binary = rows[0]["p50_ms"]
    for row in rows:
        row["speedup"] = binary / row["p50_ms"]
    return rows


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    import tritonclient.http as triton

    settings = resolve_common(args, DEFAULTS, QUICK)
    requests = pick(args, "requests", DEFAULTS, QUICK)
    document = new_document(NAME, "system shared memory vs binary HTTP tensors", command_line(argv),
                            {**settings.to_json(), "requests": requests, "sizes_mib": list(SIZES_MIB)})
    with workspace(NAME) as tmp:
        build_double_model(tmp / "repo")
        # A 16 MiB input and its 16 MiB output share one slot. Client shared memory is off unless turned
        # on, here for this bench's own segments only.
        service = ringserve_service("ringserve", tmp / "repo", [MODEL], log_dir=tmp / "logs", workers=settings.workers,
                                    intra_op_threads=settings.intra_op_threads,
                                    extra_args=["--slot-mb", "40", "--slot-count", "4", "--allow-client-shm",
                                                "--client-shm-key-prefix", "/bench-"],
                                    description=f"{MODEL}: y = 2x, FP32 [-1], max_batch_size 0")
        with running([service], settings, document):
            client = triton.InferenceServerClient(f"127.0.0.1:{service.port}", connection_timeout=60,
                                                  network_timeout=settings.request_timeout_s)
            try:
                for size in SIZES_MIB:
                    rows = measure(client, size, requests)
                    log.info("%d MiB: %s", size, {r["mode"]: round(r["p50_ms"], 2) for r in rows})
                    document["summary"].extend(rows)
            finally:
                client.close()
    write_outputs(document, settings, render_markdown(document))
    return document


def render_markdown(document: dict[str, Any]) -> str:
    return ("One tritonclient.http client, requests one after the other, binary and shm alternating; "
            "round trip on the client (shm: the output read from its region included).\n\n"
            + render_table(document["summary"], COLUMNS) + "\n")
