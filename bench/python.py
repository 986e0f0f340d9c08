"""`python -m bench python`: a Python model (Triton's model.py) beside the same computation as ONNX.

Cases (two ringserve servers, one per model, each with one worker, up for the whole invocation; runs
interleaved, the order rotating with each repeat):
  onnx     `mlp`, the demo ONNX model: ONNX Runtime in the worker on each batch
  python   `mlp_py`, a model.py (MLP_PY below): execute gets one pb_utils.InferenceRequest per
           client request, stacks their rows, runs the same mlp.onnx with ONNX Runtime (one
           session.run per batch, one thread, spinning off, as the worker's own sessions) and
           answers each request with its rows: the same computation, through the Python path
  triton   with --peers triton: PyTriton's tritonserver, whose Python backend hands each batch to
           ONNX Runtime in Python (bench/peers/triton_app.py), the peer that runs a Python path too

The Python path's cost per request is the python case's server CPU µs per request less the onnx
case's, and its latency over onnx's at 1 client (both in the side-by-side table).
"""
from __future__ import annotations

import argparse
import json
import logging
import textwrap
from pathlib import Path
from typing import Any

from bench.load import Payload, make_infer_body
from bench.models import case_repository
from bench.report import new_document, plot_throughput_and_cdf, ratio, render_table
from bench.runner import Case, run_matrix, summarize_all
from bench.servers import ringserve_service
from bench.suite import add_common_arguments, command_line, levels, pick, resolve_common, running, workspace, \
    write_outputs

log = logging.getLogger(__name__)

NAME = "python"
DEFAULTS = {"duration_s": 8.0, "warmup_s": 2.0, "repeats": 3, "concurrency": [1, 64]}
QUICK = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "concurrency": [1, 4]}
CASES = {"onnx": "ONNX model (mlp)", "python": "Python model (mlp_py: model.py running the same graph)",
         "triton": "Triton via PyTriton (Python backend, ONNX Runtime)"}

MLP_PY = """
import json

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(config["parameters"]["onnx_path"]["string_value"], options,
                                            providers=["CPUExecutionProvider"])

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        y = self.session.run(["y"], {"x": np.concatenate(xs) if len(xs) > 1 else xs[0]})[0]
        responses, start = [], 0
        for x in xs:
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y[start:start + len(x)])]))
            start += len(x)
        return responses
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="a Python model (model.py) vs the same computation as an ONNX model",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=levels, default=None,
                   help=f"comma-separated client counts (default {','.join(map(str, DEFAULTS['concurrency']))})")
    p.add_argument("--peers", default="", help="peers to measure beside ringserve: triton")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def build_repositories(tmp: Path) -> tuple[Path, Path]:
    """`<tmp>/repo-onnx/mlp` (the demo's) and `<tmp>/repo-python/mlp_py`: MLP_PY over the same
    model.onnx, with the same config otherwise."""
    from ringserve.common.repository.demo import build_demo_models

    build_demo_models(tmp / "demo")
    onnx_repo = case_repository(tmp, tmp / "demo", "mlp", "onnx")
    config = json.loads((onnx_repo / "mlp" / "config.json").read_text())
    config.update(name="mlp_py", backend="python", parameters={
        "onnx_path": {"string_value": str((onnx_repo / "mlp" / "1" / "model.onnx").resolve())}})
    del config["platform"]
    python_repo = tmp / "repo-python"
    (python_repo / "mlp_py" / "1").mkdir(parents=True)
    (python_repo / "mlp_py" / "1" / "model.py").write_text(textwrap.dedent(MLP_PY).lstrip())
    (python_repo / "mlp_py" / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return onnx_repo, python_repo


def build_cases(settings, tmp: Path, peers: list[str], document: dict[str, Any]) -> list[Case]:
    onnx_repo, python_repo = build_repositories(tmp)
    services = {name: ringserve_service(f"ringserve_{name}", repo, [model], log_dir=tmp / "logs",
                                        workers=settings.workers, intra_op_threads=settings.intra_op_threads,
                                        description=f"ringserve serving {model}")
                for name, repo, model in (("onnx", onnx_repo, "mlp"), ("python", python_repo, "mlp_py"))}
    body = make_infer_body()
    payload = Payload.single(body, description=f"KServe v2 JSON, one row of 512 FP32 values, {len(body)} bytes")
    cases = [Case("onnx", CASES["onnx"], services["onnx"], payload, "mlp"),
             Case("python", CASES["python"], services["python"], payload, "mlp_py")]
    if "triton" in peers:
        cases += triton_case(tmp, onnx_repo, body, document)
    document["payloads"] = {c.name: c.payload.describe() for c in cases}
    return cases


def triton_case(tmp: Path, repo: Path, body: bytes, document: dict[str, Any]) -> list[Case]:
    from bench.peers import PEERS, PeerUnavailable, install, peer_service

    try:
        install(PEERS["triton"])
    except PeerUnavailable as exc:
        log.warning("%s", exc)
        document.setdefault("skipped", {})["triton"] = exc.why
        return []
    service = peer_service(PEERS["triton"], repo / "mlp" / "1" / "model.onnx", workdir=tmp, log_dir=tmp / "logs",
                           body=body)
    return [Case("triton", CASES["triton"], service, Payload.single(body, description="as onnx"), "mlp")]


def side_by_side(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per client count: each case's req/s, p50 and server CPU per request; python against onnx."""
    rows: dict[int, dict[str, Any]] = {}
    for r in summary:
        if r["mode"] != "closed":
            continue
        row = rows.setdefault(r["clients"], {"clients": r["clients"]})
        for key in ("rps", "p50_ms", "p99_ms", "server_cpu_us_per_request", "mean_batch", "errors"):
            row[f"{r['case']}_{key}"] = r.get(key)
    for row in rows.values():
        row["python_vs_onnx"] = ratio(row.get("python_rps"), row.get("onnx_rps"))
        row["triton_vs_python"] = ratio(row.get("triton_rps"), row.get("python_rps"))
        cpu = (row.get("python_server_cpu_us_per_request"), row.get("onnx_server_cpu_us_per_request"))
        row["python_overhead_cpu_us"] = None if None in cpu else round(cpu[0] - cpu[1], 1)
        p50 = (row.get("python_p50_ms"), row.get("onnx_p50_ms"))
        row["python_overhead_p50_us"] = None if None in p50 else round((p50[0] - p50[1]) * 1000, 1)
    return [rows[n] for n in sorted(rows)]


def render_markdown(document: dict[str, Any]) -> str:
    cases = [c for c in CASES if any(r["case"] == c for r in document["summary"])]
    columns = [("clients", "clients", 0)]
    for case in cases:
        columns += [(f"{case} req/s", f"{case}_rps", 0), (f"{case} p50 ms", f"{case}_p50_ms", 2),
                    (f"{case} CPU µs/req", f"{case}_server_cpu_us_per_request", 0),
                    (f"{case} batch", f"{case}_mean_batch", 1)]
    columns += [("python / onnx", "python_vs_onnx", 2), ("Python path CPU µs/req", "python_overhead_cpu_us", 0),
                ("Python path p50 µs", "python_overhead_p50_us", 0)]
    if "triton" in cases:
        columns.append(("triton / python", "triton_vs_python", 2))
    parts = ["### A Python model beside the same computation as ONNX (medians over repeats)",
             render_table(document["side_by_side"], columns)]
    for peer, why in (document.get("skipped") or {}).items():
        parts.append(f"{peer}: skipped, {why}")
    if document.get("interrupted"):
        parts.insert(0, f"**{document['interrupted']}**")
    return "\n\n".join(parts)


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    settings = resolve_common(args, DEFAULTS, QUICK)
    concurrency = pick(args, "concurrency", DEFAULTS, QUICK)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    document = new_document(NAME, "A Python model (model.py) vs the same computation as an ONNX model",
                            command_line(argv), {**settings.to_json(), "concurrency": concurrency, "peers": peers})
    interrupted: BaseException | None = None
    with workspace(NAME) as tmp:
        cases = build_cases(settings, tmp, peers, document)
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
    plot_throughput_and_cdf(document["summary"], settings.plots_dir, NAME, "Python model vs ONNX")
    write_outputs(document, settings, render_markdown(document))
    if interrupted is not None:
        raise interrupted
    return document
