"""`python -m bench profile`: where the gateway's (and worker's) time goes on the `mlp` infer path.

ringserve `mlp` (batching) and the raw ASGI ceiling, each under 64 wrk clients: first a run without
the profiler (its req/s is the reference), then a run with py-spy (--nonblocking, so the target is
never paused) sampling the gateway and the worker (and the ceiling's one process). Each sample is
given to the innermost frame that belongs to a known part of the path (CATEGORIES, first match
from the leaf up); a sample whose innermost frame is the event loop's entry is time in uvloop's C
code (socket reads and writes, httptools parsing, epoll). Shares times the CPU per request of the
process's Python threads (from the kernel's per-thread accounting over the same window) give
microseconds per request; threads py-spy cannot see (libzmq's I/O thread, ONNX Runtime's pool)
get their own rows from the same accounting.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.ceilings import precomputed_answer  # noqa: F401 - the ceiling answers like ringserve
from bench.load import Payload, make_infer_body
from bench.models import build_case_repositories
from bench.report import new_document, render_table
from bench.runner import ServiceWindow, wait_for_quiet
from bench.servers import Service, ringserve_service, uvicorn_service
from bench.suite import (
    add_common_arguments,
    command_line,
    resolve_common,
    running,
    workspace,
    write_outputs,
)
from bench.load import run_load
from bench.wrk import run_wrk, wrk_path

log = logging.getLogger(__name__)

NAME = "profile"
MODEL = "mlp"
DEFAULTS = {"duration_s": 8.0, "warmup_s": 2.0, "repeats": 1}
QUICK = {"duration_s": 1.0, "warmup_s": 0.0}

# (category, regex on one frame "function (file:line)"). Checked from the leaf up; first match wins.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("ZeroMQ send/recv (pyzmq, gateway/dispatch/link.py)", r"\((zmq/|gateway/dispatch/link\.py)"),
    ("wire: control message encode/decode", r"\(common/(messages|supervisor_messages|wire)\.py"),
    ("metrics + statistics (prometheus_client)", r"\((prometheus_client/|gateway/observe/(metrics|stats)\.py)"),
    ("ONNX Runtime session.run", r"(InferenceSession\.run|ModelSession\.run) "),
    ("slot: numpy views, copies in/out (shm)", r"\((shm/|gateway/batching/slot(s|_outputs)\.py)"),
    ("codec: encode response", r"\(gateway/(codec/encode|grpc/codec)\.py|encode\w* \(gateway/codec/binary\.py"),
    ("codec: parse body -> numpy (orjson, np.asarray, checks)", r"\(gateway/(codec/parse|core/request|codec/binary)\.py"),
    ("queues: lanes, collect batch, deadlines", r"\(gateway/batching/(queues|deadlines)\.py"),
    ("scheduler: submit, pump, replies, requeue (dispatch, fleet, catalog)",
     r"\(gateway/dispatch/"),
    ("infer endpoint (http/routes.py, app.py, kserve/dataplane.py)", r"\(gateway/(http/(routes|app)|kserve/dataplane|batching/padding)\.py"),
    ("worker loop (worker/)", r"\(worker/"),
    ("ceiling app (orjson + numpy)", r"\(bench/ceilings/"),
    ("uvicorn HTTP protocol (Python)", r"\(uvicorn/"),
    ("asyncio (futures, tasks, timers)", r"\(asyncio/"),
)
EVENT_LOOP_LEAF = re.compile(r"^(Runner\.run|run_until_complete|run_forever|asyncio_run) ")
COMPILED = [(name, re.compile(pattern)) for name, pattern in CATEGORIES]


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="py-spy the gateway + worker (and the raw ASGI ceiling) under load",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rate-hz", type=int, default=250, help="py-spy sampling rate")
    p.add_argument("--native", action="store_true", help="py-spy --native (C frames too; slower)")
    add_common_arguments(p, DEFAULTS, QUICK)
    p.set_defaults(func=main)
    return p


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def parse_collapsed(text: str) -> Counter:
    """py-spy's raw (collapsed) output: 'frame;frame;...;leaf COUNT' per line -> Counter of stacks."""
    stacks: Counter = Counter()
    for line in text.splitlines():
        head, _, count = line.rpartition(" ")
        if head and count.isdigit():
            stacks[head] += int(count)
    return stacks


def _frames(stack: str) -> list[str]:
    # Frames are separated by ';' but a frame is "name (file:line)"; names never contain ';'.
    return [f for f in stack.split(";") if f]


def categorize(stacks: Counter) -> Counter:
    """Samples per category (innermost known frame wins)."""
    out: Counter = Counter()
    for stack, count in stacks.items():
        frames = _frames(stack)
        leaf = frames[-1] if frames else ""
        category = None
        if EVENT_LOOP_LEAF.search(leaf):
            category = "event loop + socket I/O + HTTP parsing (uvloop/httptools, C)"
        for frame in reversed(frames if category is None else []):
            category = next((name for name, rx in COMPILED if rx.search(frame)), None)
            if category:
                break
        if category is None:
            category = "worker heartbeat thread" if "Heartbeat" in stack else "other Python"
        out[category] += count
    return out


def top_functions(stacks: Counter, inclusive: bool, limit: int = 15) -> list[tuple[str, int]]:
    counts: Counter = Counter()
    for stack, count in stacks.items():
        frames = _frames(stack)
        if not frames:
            continue
        if inclusive:
            for frame in {_strip_line(f) for f in frames}:
                counts[frame] += count
        else:
            counts[_strip_line(frames[-1])] += count
    return counts.most_common(limit)


def _strip_line(frame: str) -> str:
    """'f (path/x.py:123)' -> 'f (path/x.py)': lines of one function add up."""
    return re.sub(r":\d+\)$", ")", frame)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) by thread name, from /proc/<pid>/task/*/{comm,stat}.

    py-spy sees Python threads only; libzmq's I/O threads (ZMQbg/IO/n) and ONNX Runtime's pool
    do real work too, and their share of the process's CPU is told apart here.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            tid = int(os.path.basename(task))
            name = "main (Python)" if tid == pid else Path(task, "comm").read_text().strip()
            fields = Path(task, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return out


def record(pid: int, seconds: int, rate_hz: int, out: Path, native: bool) -> subprocess.Popen:
    command = [py_spy() or "py-spy", "record", "-p", str(pid), "-d", str(seconds), "-r", str(rate_hz), "-f", "raw",
               "-o", str(out), "--nonblocking"]
    if native:
        command.append("--native")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def profile_service(service: Service, payload: Payload, roles: list[str], *, settings, clients: int, rate_hz: int,
                    out_dir: Path, native: bool, model: str | None) -> dict[str, Any]:
    """A reference run, then a profiled run; per role: samples by category and µs per request."""
    seconds = max(1, round(settings.duration_s))
    quiet = [wait_for_quiet(settings.quiet_wait_s, settings.quiet_busy_pct)] if settings.quiet_wait_s else []
    closed_loop = run_wrk if wrk_path() else run_load  # (a fresh machine has no wrk: aiohttp's loop)
    reference = closed_loop(service.infer_url, payload, concurrency=clients, duration_s=seconds,
                        warmup_s=settings.warmup_s)
    pids = service.pids_by_role()
    window = ServiceWindow(service, model)
    if settings.quiet_wait_s:
        quiet.append(wait_for_quiet(settings.quiet_wait_s, settings.quiet_busy_pct))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(closed_loop, service.infer_url, payload, concurrency=clients, duration_s=seconds + 2,
                             warmup_s=0, window=window)
        time.sleep(1.0)
        cpu0 = service.cpu_seconds()
        threads0 = {role: thread_cpu(pids[role][0]) for role in roles if role in pids}
        t0 = time.perf_counter()
        spies = {role: record(pids[role][0], seconds, rate_hz, out_dir / f"profile-{service.name}-{role}.txt", native)
                 for role in roles if role in pids}
        errors = {role: spy.communicate()[1].decode(errors="replace")[-500:] for role, spy in spies.items()
                  if spy.wait() != 0}
        cpu1, wall = service.cpu_seconds(), time.perf_counter() - t0
        threads1 = {role: thread_cpu(pids[role][0]) for role in threads0}
        load = future.result()
    result: dict[str, Any] = {"reference_rps": reference.rps, "profiled_rps": load.rps, "p99_ms": load.p99_ms,
                              "errors": errors, "quiet": quiet, "roles": {}}
    requests_in_profile = load.rps * wall
    batch_info = window.result(load)
    result["mean_batch"] = batch_info.get("mean_batch")
    result["foreign_cpu_pct"] = batch_info.get("foreign_cpu_pct")
    for role in spies:
        path = out_dir / f"profile-{service.name}-{role}.txt"
        stacks = parse_collapsed(path.read_text()) if path.exists() else Counter()
        total = sum(stacks.values())
        cpu_s = sum(s for pid, (r, s) in cpu1.items() if r == role) - \
            sum(s for pid, (r, s) in cpu0.items() if r == role)
        us_per_request = cpu_s / requests_in_profile * 1e6 if requests_in_profile else None
        categories = categorize(stacks)
        by_thread = {name: threads1[role].get(name, 0.0) - seconds0
                     for name, seconds0 in threads0[role].items()}
        by_thread = {name: s for name, s in by_thread.items() if s > 0.0}
        python_s = sum(s for name, s in by_thread.items() if not _native_thread(name))
        python_us = python_s / requests_in_profile * 1e6 if requests_in_profile else None
        rows = [{"category": c, "samples": n, "share": n / total if total else None,
                 "us_per_request": (n / total * python_us) if total and python_us else None}
                for c, n in categories.most_common()]
        for name, seconds_used in sorted(by_thread.items(), key=lambda kv: -kv[1]):
            if _native_thread(name):
                rows.append({"category": f"native thread {name} (not sampled by py-spy)", "samples": None,
                             "share": None, "us_per_request": seconds_used / requests_in_profile * 1e6
                             if requests_in_profile else None})
        result["roles"][role] = {
            "samples": total, "cpu_pct": cpu_s / wall * 100.0, "cpu_us_per_request": us_per_request,
            "python_threads_us_per_request": python_us, "raw": str(path),
            "threads_cpu_pct": {name: round(s / wall * 100.0, 1) for name, s in by_thread.items()},
            "categories": rows,
            "top_self": [{"function": f, "samples": n, "share": n / total} for f, n in top_functions(stacks, False)],
            "top_inclusive": [{"function": f, "samples": n, "share": n / total}
                              for f, n in top_functions(stacks, True)]}
    return result


def _native_thread(name: str) -> bool:
    """Threads py-spy cannot sample: libzmq's (ZMQbg/...) and ONNX Runtime's pool; Python threads
    (main, heartbeat, model loader) keep Python's names or the process's."""
    return name.startswith(("ZMQbg", "onnxruntime", "ort"))


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    settings = resolve_common(args, DEFAULTS, QUICK)
    document = new_document(NAME, "profile: the mlp infer path in the gateway and worker, vs the raw ASGI ceiling",
                            command_line(argv), {**settings.to_json(), "clients": args.clients,
                                                 "rate_hz": args.rate_hz, "native": args.native})
    if py_spy() is None:
        document["skipped"] = "py-spy is not installed (pip install py-spy)"
        write_outputs(document, settings, "skipped: py-spy is not installed")
        return document
    body = make_infer_body()
    payload = Payload.single(body)
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    with workspace(NAME) as tmp:
        repos = build_case_repositories(tmp, MODEL)
        ringserve = ringserve_service("ringserve", repos["batched"], [MODEL], log_dir=tmp / "logs",
                                      workers=settings.workers, intra_op_threads=settings.intra_op_threads,
                                      description="ringserve (batching, mbs 64)")
        ceiling = uvicorn_service("raw_asgi", "bench.ceilings.raw_asgi:app", log_dir=tmp / "logs", body=body,
                                  description="ceiling: raw ASGI + orjson")
        with running([ringserve, ceiling], settings, document):
            common = {"settings": settings, "clients": args.clients, "rate_hz": args.rate_hz,
                      "out_dir": settings.out_dir, "native": args.native}
            document["profiles"] = {
                "ringserve": profile_service(ringserve, payload, ["gateway", "worker"], model=MODEL, **common),
                "raw_asgi": profile_service(ceiling, payload, ["python"], model=None, **common)}
    write_outputs(document, settings, render_markdown(document))
    return document


def render_markdown(document: dict[str, Any]) -> str:
    parts = []
    for name, profile in document.get("profiles", {}).items():
        parts.append(f"### {name}: {profile['reference_rps']:,.0f} req/s unprofiled, {profile['profiled_rps']:,.0f} "
                     f"req/s under py-spy (mean batch {profile.get('mean_batch') or '-'})")
        for role, data in profile["roles"].items():
            us = data["cpu_us_per_request"]
            parts.append(f"**{role}**: {data['cpu_pct']:.0f}% of a core, "
                         f"{'-' if us is None else f'{us:,.0f}'} µs CPU per request, {data['samples']} samples; "
                         f"CPU % by thread: {data.get('threads_cpu_pct')}")
            parts.append(render_table(data["categories"], [
                ("where", "category", None), ("samples", "samples", 0), ("share", "share", 3),
                ("µs/request", "us_per_request", 1)]))
            parts.append("Top functions (self):")
            parts.append(render_table(data["top_self"][:10], [("function", "function", None), ("share", "share", 3)]))
        if profile.get("errors"):
            parts.append(f"py-spy errors: {profile['errors']}")
    return "\n\n".join(parts)
