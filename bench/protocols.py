"""`python -m bench protocols`: KServe v2 over gRPC vs HTTP JSON vs HTTP binary, one server, side by side.

Cases (one ringserve serving `mlp` over HTTP and --grpc-port for the whole invocation; runs
interleaved, the order rotating with each repeat):
  grpc          ModelInfer, one row of 512 FP32 values in raw_input_contents (what tritonclient.grpc
                sends), answered in raw_output_contents; grpc.aio, a channel per client, the request
                serialized once and the answer's bytes left unparsed (bench/load.py: run_grpc_load)
  http_json     the same row as KServe JSON (~10 KB)
  http_binary   the same row in the binary tensor extension, the answer asked in binary
  http_json_grpc_off  http_json on a second, identical server started with --grpc-port 0: what serving
                gRPC beside HTTP costs HTTP's requests (nothing, when it holds)

The HTTP cases use the suite's generator (wrk when installed, else aiohttp); gRPC has no wrk, so its
client is Python's grpc.aio: each run reports its generator's CPU, and a generator near 100 % of a
core is the limit, not the server. Server CPU µs per request is the fairer column on a small machine.
"""
from __future__ import annotations

import argparse
import logging
from typing import Any

import numpy as np

from bench.load import Payload, make_binary_infer_body, make_infer_body, run_grpc_load
from bench.models import build_case_repositories
from bench.report import new_document, plot_throughput_and_cdf, ratio, render_table
from bench.runner import Case, run_matrix, summarize_all
from bench.servers import free_port, ringserve_service
from bench.suite import add_common_arguments, command_line, levels, pick, resolve_common, running, workspace, \
    write_outputs

log = logging.getLogger(__name__)

NAME = "protocols"
MODEL = "mlp"
DEFAULTS = {"duration_s": 8.0, "warmup_s": 2.0, "repeats": 3, "concurrency": [1, 16, 64]}
QUICK = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "concurrency": [1, 4]}
CASES = {"grpc": "gRPC (raw contents)", "http_json": "HTTP JSON", "http_binary": "HTTP binary",
         "http_json_grpc_off": "HTTP JSON, server with --grpc-port 0"}
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="gRPC vs HTTP JSON vs HTTP binary on one server, 1/16/64 clients",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=levels, default=None,
                   help=f"comma-separated client counts (default {','.join(map(str, DEFAULTS['concurrency']))})")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def grpc_request_bytes(width: int = 512) -> bytes:
    """The row make_infer_body sends, as a serialized ModelInferRequest with raw contents."""
    from tritonclient.grpc import service_pb2 as pb

    from bench.load import BODY_SEED

    row = np.random.default_rng(BODY_SEED).standard_normal(width).astype("<f4")
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="x", datatype="FP32", shape=[1, width])
    request.outputs.add(name="y")
    request.raw_input_contents.append(row.tobytes())
    return request.SerializeToString()


def build_cases(settings, tmp, document: dict[str, Any]) -> list[Case]:
    repos = build_case_repositories(tmp, MODEL)
    grpc_port = free_port()
    service = ringserve_service("ringserve", repos["batched"], [MODEL], log_dir=tmp / "logs",
                                workers=settings.workers, intra_op_threads=settings.intra_op_threads,
                                description="ringserve, HTTP and gRPC", grpc_port=grpc_port)
    http_only = ringserve_service("ringserve_grpc_off", repos["batched"], [MODEL], log_dir=tmp / "logs",
                                  workers=settings.workers, intra_op_threads=settings.intra_op_threads,
                                  description="ringserve, HTTP only (--grpc-port 0)", grpc_port=0)
    body = make_infer_body()
    binary, headers = make_binary_infer_body()
    request = grpc_request_bytes()
    target = f"127.0.0.1:{grpc_port}"

    def grpc_load(**kwargs: Any):
        return run_grpc_load(target, INFER_METHOD, request, **kwargs)

    payloads = {
        "http_json_grpc_off": Payload.single(body, description="as http_json"),
        "grpc": Payload.single(request, content_type="application/grpc",
                               description=f"ModelInferRequest, raw contents, {len(request)} bytes"),
        "http_json": Payload.single(body, description=f"KServe v2 JSON, one row of 512 FP32 values, {len(body)} bytes"),
        "http_binary": Payload(bodies=(binary,), headers=(headers,), content_type="application/octet-stream",
                               description=f"binary tensor extension, {len(binary)} bytes"),
    }
    document["payloads"] = {name: p.describe() for name, p in payloads.items()}
    return [Case(name, label, http_only if name == "http_json_grpc_off" else service, payloads[name], MODEL,
                 load=grpc_load if name == "grpc" else None) for name, label in CASES.items()]


def side_by_side(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per client count: each protocol's req/s, p50/p99 and server CPU per request, gRPC against each."""
    rows: dict[int, dict[str, Any]] = {}
    for r in summary:
        if r["mode"] != "closed":
            continue
        row = rows.setdefault(r["clients"], {"clients": r["clients"]})
        for key in ("rps", "p50_ms", "p99_ms", "server_cpu_us_per_request", "gen_cpu_pct", "errors"):
            row[f"{r['case']}_{key}"] = r.get(key)
    for row in rows.values():
        for other in ("http_json", "http_binary"):
            row[f"grpc_vs_{other}"] = ratio(row.get("grpc_rps"), row.get(f"{other}_rps"))
        row["json_grpc_on_vs_off"] = ratio(row.get("http_json_rps"), row.get("http_json_grpc_off_rps"))
    return [rows[n] for n in sorted(rows)]


def render_markdown(document: dict[str, Any]) -> str:
    columns = [("clients", "clients", 0)]
    for case in ("grpc", "http_json", "http_binary"):
        columns += [(f"{case} req/s", f"{case}_rps", 0), (f"{case} p50 ms", f"{case}_p50_ms", 2),
                    (f"{case} p99 ms", f"{case}_p99_ms", 2)]
    columns += [("gRPC / JSON", "grpc_vs_http_json", 2), ("gRPC / binary", "grpc_vs_http_binary", 2)]
    cpu = [("clients", "clients", 0)] + [(f"{case} server CPU µs/req", f"{case}_server_cpu_us_per_request", 0)
                                         for case in CASES]
    cpu += [(f"{case} generator CPU %", f"{case}_gen_cpu_pct", 0) for case in CASES]
    off = [("clients", "clients", 0), ("gRPC on req/s", "http_json_rps", 0),
           ("gRPC off req/s", "http_json_grpc_off_rps", 0), ("on / off", "json_grpc_on_vs_off", 2),
           ("gRPC on CPU µs/req", "http_json_server_cpu_us_per_request", 0),
           ("gRPC off CPU µs/req", "http_json_grpc_off_server_cpu_us_per_request", 0)]
    parts = ["### Throughput and latency (medians over repeats)", render_table(document["side_by_side"], columns),
             "### Server CPU per request, and the generators' CPU", render_table(document["side_by_side"], cpu),
             "### HTTP JSON on a server serving gRPC too, and on one with --grpc-port 0",
             render_table(document["side_by_side"], off)]
    if document.get("interrupted"):
        parts.insert(0, f"**{document['interrupted']}**")
    return "\n\n".join(parts)


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    settings = resolve_common(args, DEFAULTS, QUICK)
    concurrency = pick(args, "concurrency", DEFAULTS, QUICK)
    document = new_document(NAME, "KServe v2 over gRPC vs HTTP JSON vs HTTP binary, one server",
                            command_line(argv), {**settings.to_json(), "concurrency": concurrency})
    interrupted: BaseException | None = None
    with workspace(NAME) as tmp:
        cases = build_cases(settings, tmp, document)
        services = list({id(c.service): c.service for c in cases}.values())
        with running(services, settings, document):
            try:
                run_matrix(cases, concurrency, repeats=settings.repeats, duration_s=settings.duration_s,
                           warmup_s=settings.warmup_s, generator=settings.generator,
                           request_timeout_s=settings.request_timeout_s, quiet=settings.quiet,
                           sink=document["runs"])
            except (SystemExit, KeyboardInterrupt) as exc:  # a timeout's SIGTERM: keep what was measured
                interrupted = exc
                document["interrupted"] = f"stopped after {len(document['runs'])} runs; the tables hold those only"
    document["summary"] = summarize_all(document["runs"], dict(CASES))
    document["side_by_side"] = side_by_side(document["summary"])
    plot_throughput_and_cdf(document["summary"], settings.plots_dir, NAME, "protocols")
    write_outputs(document, settings, render_markdown(document))
    if interrupted is not None:
        raise interrupted
    return document
