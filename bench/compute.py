"""`python -m bench compute`: a compute-bound model, where batching should pay and the server add little.

`mlp_large` (bench/models.py: 512 -> 3 x 4096-wide Gemm+Relu -> 10, ~70 MFLOP per row, ~140 MB of
weights) has the same request and answer as `mlp`, so HTTP costs the same and the model dominates.
Cases, all up for the whole invocation, runs interleaved:
  batched    max_batch_size 64, work-conserving dynamic batching
  unbatched  max_batch_size 1
  target     max_batch_size 64 + latency_target_ms (--latency-target-ms; 0 leaves the case out)
Then ONNX Runtime alone on the same batches gives the efficiency (served items/s ÷ ceiling).
"""
from __future__ import annotations

import argparse
import logging
from typing import Any

from bench.inprocess import attach_efficiency, float_rows, measure_ceiling
from bench.load import Payload, make_infer_body
from bench.models import (
    LARGE_LAYERS,
    LARGE_WIDTH,
    build_mlp_large,
    case_repository,
    mlp_large_flops_per_row,
    unbatched_config,
    with_latency_target,
)
from bench.report import (
    ceiling_tables,
    new_document,
    plot_throughput_and_cdf,
    ratio,
    render_table,
)
from bench.runner import Case, run_matrix, summarize_all, wait_for_quiet
from bench.servers import ringserve_service
from bench.suite import (
    add_common_arguments,
    command_line,
    levels,
    pick,
    resolve_common,
    running,
    workspace,
    write_outputs,
)

log = logging.getLogger(__name__)

NAME = "compute"
MODEL = "mlp_large"
LABELS = {"batched": "mlp_large, batching (mbs 64)", "unbatched": "mlp_large, no batching (mbs 1)",
          "target": "mlp_large, batching + latency_target_ms"}
DEFAULTS = {"duration_s": 8.0, "warmup_s": 2.0, "repeats": 3, "concurrency": [1, 16, 64]}
QUICK = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "concurrency": [4]}
QUICK_WIDTH, QUICK_LAYERS = 256, 2


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="mlp_large: batching vs mbs 1, latency target, efficiency vs in-process",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=levels, default=None,
                   help=f"comma-separated client counts (default {','.join(map(str, DEFAULTS['concurrency']))})")
    p.add_argument("--width", type=int, default=None,
                   help=f"hidden width (default {LARGE_WIDTH}; --quick {QUICK_WIDTH})")
    p.add_argument("--layers", type=int, default=None, help=f"hidden layers (default {LARGE_LAYERS})")
    p.add_argument("--latency-target-ms", type=float, default=100.0,
                   help="latency_target_ms of the `target` case (0 = leave the case out)")
    p.add_argument("--ceiling-seconds", type=float, default=None, help="in-process timing per batch size (default 2)")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    settings = resolve_common(args, DEFAULTS, QUICK)
    concurrency = pick(args, "concurrency", DEFAULTS, QUICK)
    width = args.width or (QUICK_WIDTH if args.quick else LARGE_WIDTH)
    layers = args.layers or (QUICK_LAYERS if args.quick else LARGE_LAYERS)
    names = ["batched", "unbatched"] + (["target"] if args.latency_target_ms > 0 else [])
    document = new_document(NAME, f"compute-bound: {MODEL} ({layers} x {width}-wide layers), batching vs mbs 1, "
                                  "latency target, efficiency vs in-process", command_line(argv),
                            {**settings.to_json(), "concurrency": concurrency, "width": width, "layers": layers,
                             "latency_target_ms": args.latency_target_ms, "cases": names})
    document["model"] = {"name": MODEL, "width": width, "layers": layers,
                         "mflop_per_row": mlp_large_flops_per_row(width, layers) / 1e6}
    body = make_infer_body()
    payload = Payload.single(body, description="KServe v2 JSON, one row of 512 FP32 values")
    with workspace(NAME) as tmp:
        source = tmp / "source"
        model_path = build_mlp_large(source, width, layers)
        document["model"]["onnx_mib"] = round(model_path.stat().st_size / 2**20, 1)
        edits = {"batched": None, "unbatched": unbatched_config, "target": with_latency_target(args.latency_target_ms)}
        cases = []
        for name in names:
            repo = case_repository(tmp, source, MODEL, name, edits[name])
            service = ringserve_service(name, repo, [MODEL], log_dir=tmp / "logs", workers=settings.workers,
                                        intra_op_threads=settings.intra_op_threads, description=LABELS[name])
            document["services"][name] = {"config": (repo / MODEL / "config.json").read_text()}
            cases.append(Case(name, LABELS[name], service, payload, MODEL))
        with running([c.service for c in cases], settings, document):
            document["runs"] = run_matrix(cases, concurrency, repeats=settings.repeats,
                                          duration_s=settings.duration_s, warmup_s=settings.warmup_s,
                                          generator=settings.generator, request_timeout_s=settings.request_timeout_s,
                                          quiet=settings.quiet)
        ok = [r for r in document["runs"] if "failed" not in r]
        if settings.quiet_wait_s:
            document["inprocess_quiet"] = wait_for_quiet(settings.quiet_wait_s, settings.quiet_busy_pct)
        document["inprocess"] = measure_ceiling(
            model_path, float_rows("x", 512), [r.get("mean_batch") for r in ok], max_batch=64,
            intra_op_threads=settings.intra_op_threads, seconds_per_size=args.ceiling_seconds or
            (0.05 if settings.quick else 2.0), blocks=3 if settings.quick else 5)
        attach_efficiency(ok, document["inprocess"])
    document["summary"] = summarize_all(document["runs"], {c: LABELS[c] for c in names})
    document["ratios"] = ratios(document["summary"], args.latency_target_ms)
    write_outputs(document, settings, render_markdown(document, settings))
    return document


def ratios(summary: list[dict[str, Any]], target_ms: float) -> list[dict[str, Any]]:
    rows = []
    for level in sorted({r["clients"] for r in summary}):
        at = {r["case"]: r for r in summary if r["clients"] == level}
        batched, unbatched, target = at.get("batched"), at.get("unbatched"), at.get("target")
        row = {"clients": level,
               "batched_vs_unbatched": ratio(batched and batched["rps"], unbatched and unbatched["rps"]),
               "batched_efficiency": batched and batched.get("efficiency"),
               "unbatched_efficiency": unbatched and unbatched.get("efficiency")}
        if target:
            row.update({"target_vs_batched": ratio(target["rps"], batched and batched["rps"]),
                        "target_p99_ms": target["p99_ms"], "target_ms": target_ms,
                        "target_p99_within": target["p99_ms"] is not None and target["p99_ms"] <= target_ms})
        rows.append(row)
    return rows


def render_markdown(document: dict[str, Any], settings) -> str:
    summary = document["summary"]
    model = document["model"]
    parts = [(f"Model: {MODEL}, {model['layers']} x {model['width']}-wide layers, {model['mflop_per_row']:.0f} MFLOP "
              f"per row, {model.get('onnx_mib')} MiB ONNX."), "### Closed loop", render_table(summary),
             "### Ratios", render_table(document["ratios"], [
                 ("clients", "clients", None), ("batching ÷ mbs 1 (req/s)", "batched_vs_unbatched", 2),
                 ("efficiency, batching", "batched_efficiency", 3), ("efficiency, mbs 1", "unbatched_efficiency", 3),
                 ("target ÷ batching (req/s)", "target_vs_batched", 2), ("target p99 ms", "target_p99_ms", 1),
                 ("target ms", "target_ms", 0), ("p99 within target", "target_p99_within", None)])]
    parts += ceiling_tables(document["inprocess"], summary)
    document["plots"] = plot_throughput_and_cdf(summary, settings.plots_dir, "compute", MODEL)
    return "\n\n".join(parts)
