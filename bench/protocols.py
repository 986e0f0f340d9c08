"""`python -m bench protocols`: KServe v2 over gRPC (unary, streaming) vs HTTP JSON vs HTTP binary,
one server, side by side, with Triton's perf_analyzer as the client.

Cases (one ringserve serving `mlp` over HTTP and --grpc-port for the whole invocation; runs
interleaved, the order rotating with each repeat). Each request is one row of 512 FP32 values:
  grpc          perf_analyzer -i grpc: ModelInfer, the row in raw_input_contents (as tritonclient.grpc)
  grpc_stream   perf_analyzer -i grpc --streaming: every client's requests on one ModelStreamInfer
  http_json     perf_analyzer -i http with JSON tensors both ways (~10 KB bodies)
  http_binary   perf_analyzer -i http: the binary tensor extension both ways (its default)
  http_json_wrk the http_json row sent by the suite's generator (wrk when installed, else aiohttp)
  http_json_grpc_off  http_json_wrk on a second, identical server started with --grpc-port 0: what
                serving gRPC beside HTTP costs HTTP's requests (nothing, when it holds)
  http_json_public, http_binary_public  http_json and http_binary on a second server started with
                --http-engine uvicorn: what the public HTTP engine (the fast path's fallback) costs
  grpc_baseline, http_binary_baseline  with --baseline REV: grpc and http_binary against the same
                server run from a git worktree of REV
  triton_grpc   with --peers triton: perf_analyzer -i grpc against Triton (PyTriton's tritonserver)

perf_analyzer is a C++ client, so it is not what limits; where it cannot be installed (not Debian,
no network: bench/perf_analyzer.py says why) the perf_analyzer cases are left out, saying so, and
grpc is sent by Python's grpc.aio instead. "inf/exec" is the statistics' inferences per execution
over the run (how full the batches were); server CPU µs per request is the fairer column on a small
machine.
"""
from __future__ import annotations

import argparse
import logging
from typing import Any

import numpy as np

import functools
import json
import urllib.request

from bench import perf_analyzer
from bench.load import Payload, make_binary_infer_body, make_infer_body, run_grpc_load
from bench.mlp import baseline_checkout
from bench.models import build_case_repositories
from bench.peers import PEERS, PeerUnavailable, install, peer_service
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
# case: (label, the server it measures, the request it sends)
CASES = {
    "grpc": ("gRPC unary (raw contents)", "ringserve", "grpc"),
    "grpc_stream": ("gRPC streaming", "ringserve", "grpc"),
    "http_json": ("HTTP JSON", "ringserve", "json"),
    "http_binary": ("HTTP binary", "ringserve", "binary"),
    "http_json_wrk": ("HTTP JSON (wrk/aiohttp)", "ringserve", "json"),
    "http_json_grpc_off": ("HTTP JSON (wrk/aiohttp), server with --grpc-port 0", "grpc_off", "json"),
    "http_json_public": ("HTTP JSON, --http-engine uvicorn", "public", "json"),
    "http_binary_public": ("HTTP binary, --http-engine uvicorn", "public", "binary"),
    "grpc_baseline": ("gRPC unary at --baseline", "baseline", "grpc"),
    "http_binary_baseline": ("HTTP binary at --baseline", "baseline", "binary"),
    "grpc_stream_baseline": ("gRPC streaming at --baseline", "baseline", "grpc"),
    "triton_grpc": ("Triton (PyTriton) gRPC unary", "triton", "grpc"),
}
LABELS = {name: label for name, (label, _, _) in CASES.items()}
# perf_analyzer's flags per case (-u is the case's server); the cases without are sent by wrk/aiohttp
PA_PROTOCOL = {"grpc": ("-i", "grpc"), "grpc_stream": ("-i", "grpc", "--streaming"),
               "http_json": ("-i", "http", "--input-tensor-format", "json", "--output-tensor-format", "json"),
               "http_binary": ("-i", "http"), "http_binary_public": ("-i", "http"),
               "http_json_public": ("-i", "http", "--input-tensor-format", "json", "--output-tensor-format", "json"),
               "grpc_baseline": ("-i", "grpc"), "http_binary_baseline": ("-i", "http"),
               "grpc_stream_baseline": ("-i", "grpc", "--streaming"),
               "triton_grpc": ("-i", "grpc")}
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="gRPC vs HTTP JSON vs HTTP binary on one server, 1/16/64 clients",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=levels, default=None,
                   help=f"comma-separated client counts (default {','.join(map(str, DEFAULTS['concurrency']))})")
    p.add_argument("--baseline", default=None, metavar="REV",
                   help="also measure grpc and http_binary on the server code of git revision REV, side by side")
    p.add_argument("--peers", default="", help="'triton': also Triton (PyTriton's tritonserver) over gRPC")
    p.add_argument("--grpc-engine", choices=("core", "aio"), default=None,
                   help="the measured server's --grpc-engine (with --baseline: aio against the fast path, side by side)")
    p.add_argument("--cases", default="", help="comma-separated cases to run (default: every one that applies)")
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


def served_count(url: str) -> int:
    """The model's successful requests so far, by the statistics extension (all its versions)."""
    with urllib.request.urlopen(f"{url}/v2/models/{MODEL}/stats", timeout=10) as response:
        doc = json.loads(response.read())
    return sum(int(s["inference_stats"]["success"]["count"]) for s in doc["model_stats"])


def build_cases(settings, tmp, document: dict[str, Any], baseline=None, peers: tuple[str, ...] = (),
                engine: str | None = None, only: tuple[str, ...] = ()) -> list[Case]:
    repos = build_case_repositories(tmp, MODEL)
    common = dict(log_dir=tmp / "logs", workers=settings.workers, intra_op_threads=settings.intra_op_threads)
    grpc_port, baseline_grpc_port = free_port(), free_port()
    service = ringserve_service("ringserve", repos["batched"], [MODEL], description="ringserve, HTTP and gRPC",
                                grpc_port=grpc_port, extra_args=("--grpc-engine", engine) if engine else (), **common)
    http_only = ringserve_service("ringserve_grpc_off", repos["batched"], [MODEL], grpc_port=0,
                                  description="ringserve, HTTP only (--grpc-port 0)", **common)
    public = ringserve_service("ringserve_public", repos["batched"], [MODEL], grpc_port=0,
                               extra_args=("--http-engine", "uvicorn"),
                               description="ringserve, HTTP only, uvicorn's own protocol (--http-engine uvicorn)",
                               **common)
    body = make_infer_body()
    binary, headers = make_binary_infer_body()
    request = grpc_request_bytes()
    try:
        perf_analyzer.command()
        pa_missing = None
    except perf_analyzer.CannotInstall as exc:
        pa_missing = str(exc)
        log.warning("perf_analyzer cases left out: %s", exc)
    document["perf_analyzer"] = {"version": perf_analyzer.VERSION} if pa_missing is None else {"missing": pa_missing}

    def pa_load(protocol: tuple[str, ...], target: str, url: str | None):
        served = None if url is None else functools.partial(served_count, url)
        return functools.partial(perf_analyzer.run_closed_loop, target, MODEL, protocol, served=served)

    def grpc_load(target: str, **kwargs: Any):
        return run_grpc_load(target, INFER_METHOD, request, **kwargs)

    payloads = {
        "grpc": Payload.single(request, content_type="application/grpc",
                               description=f"ModelInferRequest, raw contents, {len(request)} bytes"),
        "json": Payload.single(body, description=f"KServe v2 JSON, one row of 512 FP32 values, {len(body)} bytes"),
        "binary": Payload(bodies=(binary,), headers=(headers,), content_type="application/octet-stream",
                          description=f"binary tensor extension, {len(binary)} bytes"),
    }
    document["payloads"] = {kind: p.describe() for kind, p in payloads.items()}

    # server: (its service, its gRPC address)
    servers = {"ringserve": (service, f"127.0.0.1:{grpc_port}"), "grpc_off": (http_only, None),
               "public": (public, None)}
    if baseline is not None:
        old = ringserve_service("ringserve_baseline", repos["batched"], [MODEL], source=baseline,
                                description=f"ringserve at {document['baseline']['revision']}",
                                grpc_port=baseline_grpc_port, **common)
        servers["baseline"] = (old, f"127.0.0.1:{baseline_grpc_port}")
    if "triton" in peers and pa_missing is None:
        try:
            install(PEERS["triton"], tmp / "logs" / "install-triton.log")
            triton = peer_service(PEERS["triton"], repos["batched"] / MODEL / "1" / "model.onnx", workdir=tmp,
                                  log_dir=tmp / "logs", body=body)
            servers["triton"] = (triton, f"127.0.0.1:{triton.grpc_port}")
        except PeerUnavailable as exc:
            document.setdefault("peers_unavailable", {})["triton"] = str(exc)
            log.warning("%s", exc)
    cases = []
    for name, (label, server, kind) in CASES.items():
        if server not in servers or (only and name not in only):
            continue
        svc, grpc_target = servers[server]
        model = MODEL if svc.kind == "ringserve" else None  # (a peer has no ringserve counters)
        protocol = PA_PROTOCOL.get(name) if pa_missing is None else None
        if protocol is not None:
            target = grpc_target if kind == "grpc" else f"{svc.host}:{svc.port}"
            load = pa_load(protocol, target, svc.url if model else None)
        elif name == "grpc_stream":
            continue  # (no perf_analyzer: grpc.aio's generator sends unary calls only)
        else:  # the suite's generator; gRPC by Python's grpc.aio
            load = functools.partial(grpc_load, grpc_target) if kind == "grpc" else None
        cases.append(Case(name, label, svc, payloads[kind], model, load=load))
    return cases


RATIOS = {  # column: (numerator case, denominator case)
    "grpc_vs_http_binary": ("grpc", "http_binary"), "grpc_vs_http_json": ("grpc", "http_json"),
    "stream_vs_http_binary": ("grpc_stream", "http_binary"), "grpc_vs_triton": ("grpc", "triton_grpc"),
    "grpc_vs_baseline": ("grpc", "grpc_baseline"), "http_binary_vs_baseline": ("http_binary", "http_binary_baseline"),
    "stream_vs_baseline": ("grpc_stream", "grpc_stream_baseline"),
    "json_grpc_on_vs_off": ("http_json_wrk", "http_json_grpc_off"),
    "json_public_vs_fast": ("http_json_public", "http_json"),
    "binary_public_vs_fast": ("http_binary_public", "http_binary"),
}
KEYS = ("rps", "p50_ms", "p99_ms", "mean_batch", "server_cpu_us_per_request", "gen_cpu_pct", "errors")


def side_by_side(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per client count: each case's infer/s, p50/p99, inferences per execution and server CPU
    per request, and the ratios of RATIOS."""
    rows: dict[int, dict[str, Any]] = {}
    for r in summary:
        if r["mode"] != "closed":
            continue
        row = rows.setdefault(r["clients"], {"clients": r["clients"]})
        for key in KEYS:
            row[f"{r['case']}_{key}"] = r.get(key)
    for row in rows.values():
        for column, (top, bottom) in RATIOS.items():
            row[column] = ratio(row.get(f"{top}_rps"), row.get(f"{bottom}_rps"))
    return [rows[n] for n in sorted(rows)]


def render_markdown(document: dict[str, Any]) -> str:
    rows = document["side_by_side"]
    present = [c for c in CASES if any(r.get(f"{c}_rps") is not None for r in rows)]
    speed = [("clients", "clients", 0)]
    for case in present:
        speed += [(f"{case} infer/s", f"{case}_rps", 0), (f"{case} p99 ms", f"{case}_p99_ms", 2)]
    ratios = [("clients", "clients", 0)] + [(f"{top} / {bottom}", column, 2) for column, (top, bottom) in RATIOS.items()
                                            if top in present and bottom in present]
    cost = [("clients", "clients", 0)] + [(f"{case} inf/exec", f"{case}_mean_batch", 1) for case in present]
    cost += [(f"{case} server CPU µs/req", f"{case}_server_cpu_us_per_request", 0) for case in present]
    cost += [(f"{case} client CPU %", f"{case}_gen_cpu_pct", 0) for case in present]
    parts = ["### Throughput and latency (medians over repeats)", render_table(rows, speed),
             "### Side by side", render_table(rows, ratios),
             "### Inferences per execution, server CPU per request, the clients' CPU", render_table(rows, cost)]
    missing = document.get("perf_analyzer", {}).get("missing")
    if missing:
        parts.insert(0, f"**perf_analyzer cases left out: {missing}** (gRPC sent by grpc.aio instead)")
    for peer, why in document.get("peers_unavailable", {}).items():
        parts.insert(0, f"**{peer} left out: {why}**")
    if document.get("interrupted"):
        parts.insert(0, f"**{document['interrupted']}**")
    return "\n\n".join(parts)


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    settings = resolve_common(args, DEFAULTS, QUICK)
    concurrency = pick(args, "concurrency", DEFAULTS, QUICK)
    document = new_document(NAME, "KServe v2 over gRPC vs HTTP JSON vs HTTP binary, one server",
                            command_line(argv), {**settings.to_json(), "concurrency": concurrency})
    interrupted: BaseException | None = None
    peers = tuple(p for p in (args.peers or "").split(",") if p)
    with workspace(NAME) as tmp, baseline_checkout(args.baseline, tmp, document) as baseline:
        only = tuple(c for c in (args.cases or "").split(",") if c)
        cases = build_cases(settings, tmp, document, baseline, peers, args.grpc_engine, only)
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
    document["summary"] = summarize_all(document["runs"], LABELS)
    document["side_by_side"] = side_by_side(document["summary"])
    plot_throughput_and_cdf(document["summary"], settings.plots_dir, NAME, "protocols")
    write_outputs(document, settings, render_markdown(document))
    if interrupted is not None:
        raise interrupted
    return document
