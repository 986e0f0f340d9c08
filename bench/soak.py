"""`python -m bench soak`: ringserve `mlp` under steady load for --soak-s; memory must not grow.

64 clients (closed loop) for the whole soak; every --sample-s the RSS and USS (the pages only that
process has; PSS moves when other processes map the same libraries) of the supervisor,
gateway and worker are read. Growth is judged after a warm-up (the first --settle-fraction of the
soak, while pools and caches fill): the least-squares slope in MiB/min, and last minus first.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import logging
import time
from typing import Any

from bench.load import Payload, make_infer_body, run_load
from bench.models import build_case_repositories
from bench.report import new_document, plot_series, render_table
from bench.runner import ServiceWindow, wait_for_quiet
from bench.servers import ringserve_service
from bench.suite import (
    add_common_arguments,
    command_line,
    pick,
    resolve_common,
    running,
    workspace,
    write_outputs,
)
from bench.wrk import run_wrk

log = logging.getLogger(__name__)

NAME = "soak"
MODEL = "mlp"
DEFAULTS = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "soak_s": 60.0, "sample_s": 2.0}
QUICK = {"soak_s": 2.0, "sample_s": 0.5}
ROLES = ("gateway", "worker", "supervisor")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="memory of gateway + worker under load over --soak-s (no growth)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--soak-s", type=float, default=None, help=f"soak length (default {DEFAULTS['soak_s']:g}; "
                                                              "300 for the 5-minute soak)")
    p.add_argument("--sample-s", type=float, default=None,
                   help=f"memory sample period (default {DEFAULTS['sample_s']:g})")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--settle-fraction", type=float, default=0.2, help="first part of the soak not judged")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - x_mean) ** 2 for x in xs)
    if not sxx:
        return None
    return sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / sxx * 60.0


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    settings = resolve_common(args, DEFAULTS, QUICK)
    soak_s = pick(args, "soak_s", DEFAULTS, QUICK)
    sample_s = pick(args, "sample_s", DEFAULTS, QUICK)
    document = new_document(NAME, f"soak: ringserve mlp, {args.clients} clients for {soak_s:g} s, memory over time",
                            command_line(argv), {**settings.to_json(), "soak_s": soak_s, "sample_s": sample_s,
                                                 "clients": args.clients, "settle_fraction": args.settle_fraction})
    payload = Payload.single(make_infer_body())
    samples: list[dict[str, Any]] = []
    with workspace(NAME) as tmp:
        repos = build_case_repositories(tmp, MODEL)
        service = ringserve_service("ringserve", repos["batched"], [MODEL], log_dir=tmp / "logs",
                                    workers=settings.workers, intra_op_threads=settings.intra_op_threads,
                                    description="ringserve (batching, mbs 64)")
        with running([service], settings, document), concurrent.futures.ThreadPoolExecutor(1) as pool:
            window = ServiceWindow(service, MODEL)
            if settings.quiet_wait_s:
                document["quiet"] = wait_for_quiet(settings.quiet_wait_s, settings.quiet_busy_pct)
            drive = run_wrk if settings.generator == "wrk" else run_load
            future = pool.submit(drive, service.infer_url, payload, concurrency=args.clients, duration_s=soak_s,
                                 warmup_s=0.0, window=window, request_timeout_s=settings.request_timeout_s)
            t0 = time.monotonic()
            while not future.done():
                memory = service.memory()
                samples.append({"t_s": round(time.monotonic() - t0, 2), **memory})
                time.sleep(sample_s)
            load = future.result()
            document["load"] = {**load.to_json(), **window.result(load)}
            samples.append({"t_s": round(time.monotonic() - t0, 2), **service.memory()})
    document["samples"] = samples
    document["summary"] = judge(samples, soak_s * args.settle_fraction)
    write_outputs(document, settings, render_markdown(document, settings))
    return document


def _series(samples: list[dict[str, Any]], role: str | None, key: str) -> list[tuple[float, float]]:
    if role is None:
        return [(s["t_s"], s[key]) for s in samples if key in s]
    return [(s["t_s"], s["by_role"][role][key]) for s in samples if role in s.get("by_role", {})]


def judge(samples: list[dict[str, Any]], settle_s: float) -> list[dict[str, Any]]:
    rows = []
    for role in (*ROLES, None):
        for key in ("rss_mib", "uss_mib"):
            points = _series(samples, role, key)
            judged = [p for p in points if p[0] >= settle_s] or points
            if not judged:
                continue
            rows.append({"process": role or "total", "memory": key.split("_")[0].upper(), "first_mib": judged[0][1],
                         "last_mib": judged[-1][1], "max_mib": max(p[1] for p in points),
                         "growth_mib": judged[-1][1] - judged[0][1], "slope_mib_per_min": slope_per_min(judged),
                         "samples": len(judged)})
    return rows


def render_markdown(document: dict[str, Any], settings) -> str:
    load = document.get("load", {})
    plots = settings.plots_dir
    series = {f"{role} USS": _series(document["samples"], role, "uss_mib") for role in ("gateway", "worker")}
    series.update({f"{role} RSS": _series(document["samples"], role, "rss_mib") for role in ("gateway", "worker")})
    plot = plot_series(series, plots / "soak-memory.png", "ringserve memory under load (mlp, 64 clients)",
                       "seconds", "MiB")
    document["plots"] = [str(plot)] if plot else []
    s = document["settings"]
    return "\n\n".join([
        (f"{s['clients']} clients for {s['soak_s']:g} s: {load.get('requests', 0):,} answers "
         f"({load.get('rps') or 0:,.0f} req/s, p99 {load.get('p99_ms') or 0:.1f} ms, errors {load.get('errors')}); "
         f"memory sampled every {s['sample_s']:g} s, judged after the first {s['soak_s'] * s['settle_fraction']:g} s."),
        render_table(document["summary"], [
            ("process", "process", None), ("memory", "memory", None), ("first MiB", "first_mib", 1),
            ("last MiB", "last_mib", 1), ("max MiB", "max_mib", 1), ("growth MiB", "growth_mib", 1),
            ("slope MiB/min", "slope_mib_per_min", 2), ("samples", "samples", None)])])
