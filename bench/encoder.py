"""`python -m bench encoder`: variable-length requests, padding with length buckets vs without.

The demo `encoder` (token ids + attention mask [batch, seq] -> masked-mean embedding) gets requests
whose lengths are drawn uniformly from 1..--max-length (a fixed, seeded mix of --bodies bodies,
sent in the same cycle to every case). Cases, all up for the whole invocation, runs interleaved:
  buckets     padding + sequence_buckets [16, 32, 64, 128, 256, 512] (the demo config)
  no_buckets  padding to the longest request of each batch, every length in one queue
Waste = ringserve_padded_elements_total / ringserve_real_elements_total over the window.
"""
from __future__ import annotations

import argparse
import json
import logging
import random
from typing import Any

from bench.load import Payload
from bench.models import case_repository, without_buckets
from bench.report import new_document, plot_throughput_and_cdf, ratio, render_table
from bench.runner import Case, run_matrix, summarize_all
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

NAME = "encoder"
MODEL = "encoder"
LABELS = {"buckets": "encoder, padding + length buckets", "no_buckets": "encoder, padding, no buckets"}
DEFAULTS = {"duration_s": 8.0, "warmup_s": 2.0, "repeats": 3, "concurrency": [16, 64]}
QUICK = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "concurrency": [8]}
MIX_SEED = 20240602


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="encoder length mix: buckets vs none, throughput and padding waste",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=levels, default=None,
                   help=f"comma-separated client counts (default {','.join(map(str, DEFAULTS['concurrency']))})")
    p.add_argument("--max-length", type=int, default=512, help="lengths are uniform in 1..this")
    p.add_argument("--bodies", type=int, default=256, help="distinct request bodies in the mix")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def length_mix(count: int, max_length: int, seed: int = MIX_SEED) -> tuple[Payload, list[int]]:
    """`count` KServe JSON bodies with ids and mask, lengths uniform in 1..max_length."""
    rng = random.Random(seed)
    bodies, lengths = [], []
    for _ in range(count):
        length = rng.randint(1, max_length)
        ids = [rng.randint(1, 999) for _ in range(length)]
        doc = {"inputs": [{"name": "input_ids", "shape": [1, length], "datatype": "INT64", "data": ids},
                          {"name": "attention_mask", "shape": [1, length], "datatype": "INT64", "data": [1] * length}]}
        bodies.append(json.dumps(doc, separators=(",", ":")).encode())
        lengths.append(length)
    payload = Payload(bodies=tuple(bodies),
                      description=f"{count} bodies, lengths uniform in 1..{max_length} (seed {seed}), ids + mask")
    return payload, lengths


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    from ringserve.common.repository.demo import build_demo_models

    settings = resolve_common(args, DEFAULTS, QUICK)
    concurrency = pick(args, "concurrency", DEFAULTS, QUICK)
    names = list(LABELS)
    payload, lengths = length_mix(args.bodies, args.max_length)
    mean_length = sum(lengths) / len(lengths)
    document = new_document(NAME, f"encoder: variable lengths 1..{args.max_length}, length buckets vs none",
                            command_line(argv), {**settings.to_json(), "concurrency": concurrency, "cases": names,
                                                 "max_length": args.max_length, "bodies": args.bodies})
    document["payload"] = {**payload.describe(), "mean_length": mean_length}
    with workspace(NAME) as tmp:
        build_demo_models(tmp / "demo")
        cases = []
        for name in names:
            repo = case_repository(tmp, tmp / "demo", MODEL, name, without_buckets if name == "no_buckets" else None)
            service = ringserve_service(name, repo, [MODEL], log_dir=tmp / "logs", workers=settings.workers,
                                        intra_op_threads=settings.intra_op_threads, description=LABELS[name])
            document["services"][name] = {"config": (repo / MODEL / "config.json").read_text()}
            cases.append(Case(name, LABELS[name], service, payload, MODEL))
        with running([c.service for c in cases], settings, document):
            document["runs"] = run_matrix(cases, concurrency, repeats=settings.repeats,
                                          duration_s=settings.duration_s, warmup_s=settings.warmup_s,
                                          generator=settings.generator, request_timeout_s=settings.request_timeout_s,
                                          quiet=settings.quiet)
    for run in document["runs"]:
        if "failed" not in run:
            run["tokens_per_s"] = (run["rps"] or 0.0) * mean_length
    document["summary"] = summarize_all(document["runs"], LABELS)
    for row in document["summary"]:
        row["tokens_per_s"] = (row["rps"] or 0.0) * mean_length
    document["ratios"] = [{"clients": level,
                           "waste_ratio": ratio(_at(document, "buckets", level, "padding_waste"),
                                                _at(document, "no_buckets", level, "padding_waste")),
                           "rps_ratio": ratio(_at(document, "buckets", level, "rps"),
                                              _at(document, "no_buckets", level, "rps"))}
                          for level in concurrency]
    write_outputs(document, settings, render_markdown(document, settings))
    return document


def _at(document: dict[str, Any], case: str, level: int, key: str) -> float | None:
    return next((r.get(key) for r in document["summary"] if r["case"] == case and r["clients"] == level), None)


def render_markdown(document: dict[str, Any], settings) -> str:
    summary = document["summary"]
    parts = [(f"Payload: {document['payload']['description']}; mean length "
              f"{document['payload']['mean_length']:.0f} tokens."), render_table(summary, [
                 ("case", "label", None), ("clients", "clients", None), ("req/s", "rps", 0),
                 ("tokens/s", "tokens_per_s", 0), ("p50 ms", "p50_ms", 2), ("p99 ms", "p99_ms", 2),
                 ("errors", "errors", 0), ("mean batch", "mean_batch", 1),
                 ("waste (padded/real)", "padding_waste", 3), ("compute ms/batch", "compute_ms_per_batch", 2),
                 ("server CPU %", "server_cpu_pct", 0), ("foreign CPU %", "foreign_cpu_pct", 0)]),
             "Buckets relative to no buckets:",
             render_table(document["ratios"], [("clients", "clients", None), ("waste ratio", "waste_ratio", 3),
                                                ("req/s ratio", "rps_ratio", 2)])]
    document["plots"] = plot_throughput_and_cdf(summary, settings.plots_dir, "encoder", "encoder length mix")
    return "\n\n".join(parts)
