"""`python -m bench mlp`: ringserve's `mlp` side by side with batch-1 serving, the HTTP ceilings and the peers.

Cases (all up for the whole invocation, runs interleaved):
  ringserve       mlp, max_batch_size 64, work-conserving dynamic batching (the demo config)
  ringserve_mbs1  mlp, max_batch_size 1, no dynamic_batching
  ringserve_binary  the `ringserve` server, the same row sent (and answered) as binary tensors (KServe
                  binary extension); bench/protocol.py measures JSON vs binary at 1 MiB tensors
  raw_asgi        HTTP ceiling: raw ASGI + orjson -> float32 numpy, precomputed answer
  raw_asgi_send_once  the same app under the gateway's HTTP protocol (one send() per response):
                  what ringserve's HTTP layer gives any app, shown beside the plain ceiling
  starlette       HTTP ceiling: Starlette route + stdlib json -> float32 numpy, precomputed answer
  mlserver, rayserve, litserve   with --peers: the same ONNX model in each peer, its own batching
  ringserve_otel  with --otel: the `ringserve` case with tracing on (--otel-endpoint), exporting over
                  OTLP/HTTP to a sink process (bench/otlp_sink.py): the on/off cost of tracing, side by side
  ringserve_baseline  with --baseline REV: the `ringserve` case run from a git worktree of REV (a
                  before/after of a change, measured side by side)
  ringserve_cached  (--cases) the `ringserve` model with response_cache on and --cache-config local,size=16MiB:
                  every request but the first is a hit (gateway/cache/): what a hit costs beside the ceilings
  ringserve_cached_baseline, ringserve_cache_miss_baseline  (--cases, with --baseline REV) those cases run
                  from REV
  ringserve_cache_miss  (--cases) the same model with --cache-config local,size=16KiB, cycling through
                  MISS_BODIES distinct rows (16 answers fit): every request a miss, looked up, run and stored

Closed loop at each --concurrency, then open loop (Poisson arrivals) for the two ringserve cases at
--open-fraction of ringserve's throughput at the highest concurrency (so "half of saturation"), then
the in-process ceiling at the batch sizes ringserve formed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.ceilings import precomputed_answer
from bench.inprocess import attach_efficiency, float_rows, measure_ceiling
from bench.load import Payload, make_binary_infer_body, make_infer_body, median
from bench.models import build_case_repositories
from bench.otlp_sink import otlp_sink
from bench.peers import PEERS, PeerUnavailable, cleanup_peer_temp, install, peer_service
from bench.report import (
    ceiling_tables,
    new_document,
    plot_throughput_and_cdf,
    ratio,
    render_table,
)
from bench.runner import Case, run_matrix, summarize_all, wait_for_quiet
from bench.servers import Service, ringserve_service, uvicorn_service
from bench.suite import (
    add_common_arguments,
    command_line,
    levels,
    pick,
    rates,
    resolve_common,
    running,
    workspace,
    write_outputs,
)

log = logging.getLogger(__name__)

NAME = "mlp"
MODEL = "mlp"
LABELS = {"ringserve": "ringserve (batching, mbs 64)", "ringserve_mbs1": "ringserve (no batching, mbs 1)",
          "ringserve_binary": "ringserve (batching), binary tensors",
          "raw_asgi": "ceiling: raw ASGI + orjson",
          "raw_asgi_send_once": "raw ASGI + orjson, under the gateway's HTTP protocol (send once)",
          "starlette": "ceiling: Starlette + json",
          "mlserver": PEERS["mlserver"].label, "rayserve": PEERS["rayserve"].label,
          "litserve": PEERS["litserve"].label, "triton": PEERS["triton"].label,
          "ringserve_baseline": "ringserve at the --baseline revision",
          "ringserve_otel": "ringserve (batching), tracing on: OTLP/HTTP to a local sink",
          "ringserve_cached": "ringserve, response cache on: every request a hit",
          "ringserve_cache_miss": "ringserve, response cache on: every request a miss",
          "ringserve_cached_baseline": "ringserve at the --baseline revision, response cache on: every request a hit",
          "ringserve_cache_miss_baseline": "ringserve at the --baseline revision, response cache on: every request "
                                           "a miss"}
MISS_BODIES = 256  # distinct rows cycled by ringserve_cache_miss: far more than its 16 KiB store holds
BASE_CASES = ("ringserve", "ringserve_mbs1", "ringserve_binary", "raw_asgi", "raw_asgi_send_once", "starlette")
DEFAULTS = {"duration_s": 8.0, "warmup_s": 2.0, "repeats": 3, "concurrency": [1, 16, 64]}
QUICK = {"duration_s": 1.0, "warmup_s": 0.0, "repeats": 1, "concurrency": [1, 4]}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="mlp: batching vs batch-1, HTTP ceilings, peers, open loop, in-process",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=levels, default=None,
                   help=f"comma-separated client counts (default {','.join(map(str, DEFAULTS['concurrency']))})")
    p.add_argument("--cases", default=",".join(BASE_CASES), help=f"subset of {','.join(LABELS)}")
    p.add_argument("--peers", nargs="?", const="mlserver,rayserve,litserve", default="",
                   help="also install (into bench/.peers) and measure these peers (default all three)")
    p.add_argument("--open-fraction", type=float, default=0.5,
                   help="open loop at this fraction of ringserve's req/s at the highest concurrency (0 = none)")
    p.add_argument("--rates", type=rates, default=None, help="open-loop arrivals/s instead of --open-fraction")
    p.add_argument("--ceiling-seconds", type=float, default=None, help="in-process timing per batch size (default 1)")
    p.add_argument("--baseline", default=None, metavar="REV",
                   help="also serve the `ringserve` case from a git worktree of this revision (before/after)")
    p.add_argument("--otel", action="store_true",
                   help="also serve the `ringserve` case with tracing on, exporting to a local OTLP sink (on/off cost)")
    p.add_argument("--body-decimals", type=int, default=None,
                   help="round the 512 values to this many decimals (default: full repr, as json.dumps of a "
                        "float32 row's tolist(), ~10 KB)")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def selected_cases(args: argparse.Namespace) -> list[str]:
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    names += [p.strip() for p in args.peers.split(",") if p.strip() and p.strip() not in names]
    if getattr(args, "baseline", None) and "ringserve_baseline" not in names:
        names.insert(1, "ringserve_baseline")
    if getattr(args, "otel", False) and "ringserve_otel" not in names:
        names.insert(1, "ringserve_otel")
    unknown = [n for n in names if n not in LABELS]
    if unknown or not names:
        raise SystemExit(f"unknown case(s) {unknown}; choose from {', '.join(LABELS)}")
    return names


def build_services(names: list[str], tmp: Path, body: bytes, settings, document: dict[str, Any],
                   baseline: Path | None = None, otel_endpoint: str | None = None) -> list[Case]:
    repos = build_case_repositories(tmp, MODEL)
    logs = tmp / "logs"
    payload = Payload.single(body, description=f"KServe v2 JSON, one row of 512 FP32 values, {len(body)} bytes")
    cases = []
    for name in names:
        if name == "ringserve_binary":
            continue  # shares the `ringserve` server: added below
        if name in ("ringserve", "ringserve_mbs1", "ringserve_baseline", "ringserve_otel", "ringserve_cached",
                    "ringserve_cache_miss", "ringserve_cached_baseline", "ringserve_cache_miss_baseline"):
            repo = repos["unbatched" if name == "ringserve_mbs1" else "batched"]
            if name.startswith(("ringserve_cached", "ringserve_cache_miss")):
                repo = cached_repository(repo, tmp / name)
            service: Service = ringserve_service(name, repo, [MODEL], log_dir=logs, workers=settings.workers,
                                                 intra_op_threads=settings.intra_op_threads,
                                                 description=LABELS[name],
                                                 extra_args=["--otel-endpoint", otel_endpoint]
                                                 if name == "ringserve_otel"
                                                 else ["--cache-config", "local,size=16MiB"]
                                                 if name in ("ringserve_cached", "ringserve_cached_baseline")
                                                 else ["--cache-config", "local,size=16KiB"]
                                                 if name.startswith("ringserve_cache_miss") else (),
                                                 source=baseline if name.endswith("_baseline") else None)
            document["services"][name] = {"config": (repo / MODEL / "config.json").read_text()}
            cases.append(Case(name, LABELS[name], service,
                              miss_payload(body) if name.startswith("ringserve_cache_miss") else payload, MODEL))
        elif name in ("raw_asgi", "raw_asgi_send_once", "starlette"):
            app = "bench.ceilings.starlette_json:app" if name == "starlette" else "bench.ceilings.raw_asgi:app"
            service = uvicorn_service(name, app, log_dir=logs, body=body, description=LABELS[name],
                                      send_once=name == "raw_asgi_send_once")
            cases.append(Case(name, LABELS[name], service, payload))
        else:
            peer = PEERS[name]
            try:
                install(peer)
            except PeerUnavailable as exc:
                log.warning("%s", exc)
                document.setdefault("skipped", {})[name] = str(exc)
                continue
            workdir = tmp / "peers" / name
            workdir.mkdir(parents=True, exist_ok=True)
            service = peer_service(peer, repos["batched"] / MODEL / "1" / "model.onnx", workdir=workdir,
                                   log_dir=logs, body=body)
            cases.append(Case(name, LABELS[name], service, payload))
    if "ringserve_binary" in names:
        shared = next((c.service for c in cases if c.name == "ringserve"), None)
        if shared is None:
            shared = ringserve_service("ringserve", repos["batched"], [MODEL], log_dir=logs, workers=settings.workers,
                                       intra_op_threads=settings.intra_op_threads, description=LABELS["ringserve"])
        binary, headers = make_binary_infer_body()
        cases.insert(names.index("ringserve_binary"),
                     Case("ringserve_binary", LABELS["ringserve_binary"], shared,
                          Payload(bodies=(binary,), headers=(headers,), content_type="application/octet-stream",
                                  description=f"binary tensor extension, {len(binary)} bytes"), MODEL))
    return cases


def miss_payload(body: bytes) -> Payload:
    """MISS_BODIES rows like `body`, each with its own seed: a small cache never holds the next one."""
    bodies = tuple(make_infer_body(seed=1000 + i) for i in range(MISS_BODIES))
    return Payload(bodies=bodies, description=f"{MISS_BODIES} distinct KServe v2 JSON rows, ~{len(body)} bytes each")


def cached_repository(repo: Path, target: Path) -> Path:
    """A copy of `repo` whose model has response_cache { enable: true }."""
    shutil.copytree(repo, target)
    config_path = target / MODEL / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "response_cache": {"enable": True}}))
    return target


def start_peers_tolerantly(cases: list[Case], settings, document: dict[str, Any]) -> list[Case]:
    """A peer that will not start is skipped with its reason; ringserve and the ceilings must start."""
    kept = []
    for case in cases:
        if case.service.kind != "peer":
            kept.append(case)
            continue
        try:
            case.service.start(ready_timeout_s=settings.ready_timeout_s)
            kept.append(case)
        except Exception as exc:  # noqa: BLE001 - any failure of a peer is a skip, said once
            reason = f"{case.name}: skipped, it did not start ({str(exc).splitlines()[0]}); log {case.service.log_path}"
            log.warning("%s", reason)
            document.setdefault("skipped", {})[case.name] = reason
            cleanup_peer_temp(case.service)
    return kept


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    settings = resolve_common(args, DEFAULTS, QUICK)
    concurrency = pick(args, "concurrency", DEFAULTS, QUICK)
    names = selected_cases(args)
    body = make_infer_body(decimals=args.body_decimals)
    document = new_document(NAME, "mlp: ringserve vs batch-1, HTTP ceilings, peers; open loop; in-process ceiling",
                            command_line(argv), {**settings.to_json(), "concurrency": concurrency, "cases": names,
                                                 "open_fraction": args.open_fraction, "rates": args.rates,
                                                 "body_decimals": args.body_decimals})
    document["payload"] = {"bytes": len(body), "answer_bytes_ceilings": len(precomputed_answer())}
    with (workspace(NAME) as tmp, baseline_checkout(args.baseline, tmp, document) as baseline,
          otel_sink_if("ringserve_otel" in names, tmp, document) as sink):
        all_cases = build_services(names, tmp, body, settings, document, baseline, sink.get("endpoint"))
        try:
            cases = start_peers_tolerantly(all_cases, settings, document)
            services = list({id(c.service): c.service for c in cases if c.service.kind != "peer"}.values())
            with running(services, settings, document):
                for case in cases:
                    if case.service.kind == "peer":
                        document["services"].setdefault(case.name, {}).update(
                            {"kind": "peer", "description": case.service.description, "command": case.service.args,
                             "ready_s": round(case.service.ready_s or 0.0, 2)})
                document["runs"] = run_matrix(cases, concurrency, repeats=settings.repeats,
                                              duration_s=settings.duration_s, warmup_s=settings.warmup_s,
                                              generator=settings.generator,
                                              request_timeout_s=settings.request_timeout_s, quiet=settings.quiet)
                open_rates = args.rates or _half_saturation(document["runs"], concurrency, args.open_fraction)
                open_cases = [c for c in cases if c.name in ("ringserve", "ringserve_mbs1")]
                if open_rates and open_cases:
                    document["settings"]["open_rates"] = open_rates
                    document["runs"] += run_matrix(open_cases, open_rates, mode="open", repeats=settings.repeats,
                                                   duration_s=settings.duration_s, warmup_s=settings.warmup_s,
                                                   generator=settings.generator,
                                                   request_timeout_s=settings.request_timeout_s, quiet=settings.quiet)
        finally:
            for case in all_cases:
                if case.service.kind == "peer":
                    report = case.service.stop()
                    if report:
                        document["services"].setdefault(case.name, {})["stop"] = report
                    cleanup_peer_temp(case.service)
        demo_model = tmp / "demo" / MODEL / "1" / "model.onnx"
        add_inprocess_ceiling(document, demo_model, settings, args.ceiling_seconds)
    document["summary"] = summarize_all(document["runs"], {c: LABELS[c] for c in names})
    document["ratios"] = ratios(document["summary"])
    markdown = render_markdown(document, settings)
    write_outputs(document, settings, markdown)
    return document


@contextlib.contextmanager
def baseline_checkout(revision: str | None, tmp: Path, document: dict[str, Any]) -> Iterator[Path | None]:
    """A detached git worktree of `revision` for the ringserve_baseline case, removed afterwards."""
    if not revision:
        yield None
        return
    root = Path(__file__).resolve().parent.parent
    path = tmp / "baseline"
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "--force", str(path), revision],
                   check=True, capture_output=True)
    commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    document["baseline"] = {"revision": revision, "commit": commit}
    LABELS["ringserve_baseline"] = f"ringserve at {revision} ({commit[:7]})"
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(path)], capture_output=True)


@contextlib.contextmanager
def otel_sink_if(wanted: bool, tmp: Path, document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The OTLP sink of the ringserve_otel case; what it received goes into the document as `otel_sink`."""
    if not wanted:
        yield {}
        return
    with otlp_sink(tmp) as sink:
        yield sink
    document["otel_sink"] = sink


def _half_saturation(runs: list[dict], concurrency: list[int], fraction: float) -> list[float]:
    if fraction <= 0:
        return []
    top = max(concurrency)
    rps = median([r.get("rps") for r in runs if r["case"] == "ringserve" and r["level"] == top
                  and "failed" not in r and not r.get("discarded")])
    return [round(rps * fraction)] if not math.isnan(rps) and rps > 0 else []


def add_inprocess_ceiling(document: dict[str, Any], model_path: Path, settings, seconds: float | None) -> None:
    ringserve_runs = [r for r in document["runs"] if r["case"].startswith("ringserve") and "failed" not in r]
    if settings.quiet_wait_s:
        document["inprocess_quiet"] = wait_for_quiet(settings.quiet_wait_s, settings.quiet_busy_pct)
    ceiling = measure_ceiling(model_path, float_rows("x", 512), [r.get("mean_batch") for r in ringserve_runs],
                              intra_op_threads=settings.intra_op_threads,
                              seconds_per_size=seconds or (0.05 if settings.quick else 1.0),
                              blocks=3 if settings.quick else 5)
    document["inprocess"] = ceiling
    attach_efficiency(ringserve_runs, ceiling)


def ratios(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ringserve against each other case at each closed-loop level: req/s ratio and p99s."""
    closed = [r for r in summary if r["mode"] == "closed"]
    rows = []
    for level in sorted({r["clients"] for r in closed}):
        at = {r["case"]: r for r in closed if r["clients"] == level}
        ours = at.get("ringserve")
        if ours is None:
            continue
        for other, row in at.items():
            if other == "ringserve":
                continue
            rows.append({"clients": level, "vs": other, "label": row["label"],
                         "rps_ratio": ratio(ours["rps"], row["rps"]),
                         # Noise-robust: the busiest process's CPU per request, theirs ÷ ours = the ratio of
                         # what each would serve with a core to itself.
                         "cpu_cost_ratio": ratio(row.get("busiest_cpu_us_per_request"),
                                                 ours.get("busiest_cpu_us_per_request")),
                         "ringserve_rps": ours["rps"], "other_rps": row["rps"], "ringserve_p99_ms": ours["p99_ms"],
                         "other_p99_ms": row["p99_ms"]})
    return rows


def render_markdown(document: dict[str, Any], settings) -> str:
    summary = document["summary"]
    closed = [r for r in summary if r["mode"] == "closed"]
    opened = [r for r in summary if r["mode"] == "open"]
    parts = ["### Closed loop", render_table(closed)]
    if opened:
        parts += ["### Open loop (Poisson arrivals; latency from the scheduled arrival)",
                  render_table([{**r, "rate": r["level"]} for r in opened],
                               [("case", "label", None), ("offered /s", "rate", 0), ("served req/s", "rps", 0),
                                ("p50 ms", "p50_ms", 2), ("p90 ms", "p90_ms", 2), ("p99 ms", "p99_ms", 2),
                                ("errors", "errors", 0), ("mean batch", "mean_batch", 1),
                                ("server CPU %", "server_cpu_pct", 0), ("gen CPU %", "gen_cpu_pct", 0),
                                ("foreign CPU %", "foreign_cpu_pct", 0)])]
    parts += ["### ringserve (batching) relative to each case",
              render_table(document["ratios"], [("clients", "clients", None), ("vs", "label", None),
                                                ("req/s ratio", "rps_ratio", 2),
                                                ("busiest-process CPU/req ratio", "cpu_cost_ratio", 2),
                                                ("ringserve req/s", "ringserve_rps", 0),
                                                ("their req/s", "other_rps", 0),
                                                ("ringserve p99 ms", "ringserve_p99_ms", 1),
                                                ("their p99 ms", "other_p99_ms", 1)])]
    if document.get("inprocess"):
        parts += ceiling_tables(document["inprocess"], [r for r in closed if r["case"].startswith("ringserve")])
    sink = document.get("otel_sink")
    if sink:
        parts.append(f"- ringserve_otel's OTLP sink received {sink.get('spans')} spans in {sink.get('exports')} "
                     f"exports ({sink.get('bytes', 0) / 1e6:.1f} MB)")
    for reason in document.get("skipped", {}).values():
        parts.append(f"- skipped: {reason}")
    document["plots"] = plot_throughput_and_cdf(closed, settings.plots_dir, "mlp", "mlp")
    return "\n\n".join(parts)
