"""Running cases side by side: every service up for the whole invocation, runs interleaved.

The loop is repeat → load level → case, and the order of the cases rotates with each
repeat, so a slow drift of the machine (or another process waking up) hits every case
alike and no case always runs first. Around each run's measurement window this module
reads the server's CPU (its whole process tree), the whole machine's busy time (so CPU
that neither the server nor the generator used, "foreign" CPU, shows how noisy the run
was), the server's /metrics counters, and afterwards its memory.

Summaries are medians over repeats, each column on its own; errors are summed. A repeat during
which other processes used more than --max-foreign-pct of a core is measured again; if it stays
noisy it is kept but marked, and the median uses only the quiet repeats when there are any.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import resource
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bench.load import (
    LoadResult,
    Payload,
    ServerCounters,
    counters_delta,
    median,
    run_load,
    run_open_loop,
)
from bench.servers import ServerError, Service
from bench.wrk import run_wrk, wrk_path

log = logging.getLogger(__name__)

Generator = Literal["wrk", "aiohttp"]
USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Case:
    """One thing measured: a service, what is sent to it, and the model its /metrics count under."""

    name: str
    label: str
    service: Service
    payload: Payload
    model: str | None = None  # ringserve: the model label in /metrics; None = no counters
    # More readings around each window (bench/scaling.py: per-gateway counters, NVML): objects with
    # start(), end() and result(load, window) -> dict merged into the run.
    extras: tuple[Any, ...] = ()
    # A closed-loop generator of its own, for what neither wrk nor aiohttp speaks (bench/protocols.py:
    # gRPC): load(concurrency=, duration_s=, warmup_s=, window=, request_timeout_s=) -> LoadResult.
    load: Callable[..., LoadResult] | None = None


def choose_generator(requested: str) -> Generator:
    if requested == "auto":
        return "wrk" if wrk_path() else "aiohttp"
    if requested == "wrk" and not wrk_path():
        raise SystemExit("--load wrk: no wrk on PATH (apt install wrk), or use --load aiohttp")
    return requested  # type: ignore[return-value]


def start_all(services: Sequence[Service], ready_timeout_s: float) -> None:
    """Launch every service, then wait for each: their boots (model loading) overlap."""
    try:
        for service in services:
            service.launch()
        for service in services:
            service.wait_until_ready(ready_timeout_s)
    except BaseException:
        for service in services:
            service.stop()
        raise


def system_busy_s() -> float | None:
    """CPU seconds the whole machine spent busy (all CPUs, everything but idle and iowait)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / USER_HZ
    return None


def wait_for_quiet(max_wait_s: float, busy_limit_pct: float, sample_s: float = 1.0) -> dict[str, float]:
    """Between runs (our servers idle): wait until the machine is nearly idle, at most max_wait_s.

    The machine may be shared (other users' tests); starting a run while something else burns a
    core would measure that, not us. busy_limit_pct is of the whole machine (100 = every CPU).
    """
    cpus = os.cpu_count() or 1
    t0 = time.monotonic()
    busy_pct = math.nan
    while True:
        b0 = system_busy_s()
        time.sleep(sample_s)
        b1 = system_busy_s()
        if b0 is None or b1 is None:
            return {"quiet_wait_s": 0.0, "busy_before_pct": math.nan}
        busy_pct = (b1 - b0) / sample_s / cpus * 100.0
        waited = time.monotonic() - t0
        if busy_pct <= busy_limit_pct or waited >= max_wait_s:
            return {"quiet_wait_s": round(waited, 1), "busy_before_pct": round(busy_pct, 1)}


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class ServiceWindow:
    """Window hooks for one service: its CPU, the machine's CPU, its /metrics counters."""

    def __init__(self, service: Service, model: str | None, extras: Sequence[Any] = ()) -> None:
        self.service = service
        self.model = model
        self.extras = tuple(extras)
        self.before: ServerCounters | None = None
        self.after: ServerCounters | None = None
        self.metrics_error: str | None = None

    def _scrape(self) -> ServerCounters | None:
        if self.model is None or self.service.metrics_url is None:
            return None
        try:
            with urllib.request.urlopen(self.service.metrics_url, timeout=10) as response:
                return ServerCounters.from_text(response.read().decode(), self.model)
        except OSError as exc:
            self.metrics_error = repr(exc)
            return None

    def _batch_stats(self) -> dict[int, tuple[int, int]] | None:
        """{batch size: (batches, compute ns)} from the statistics extension, when the server fills it."""
        if self.model is None or self.service.kind != "ringserve":
            return None
        try:
            with urllib.request.urlopen(f"{self.service.url}/v2/models/{self.model}/stats", timeout=10) as response:
                doc = json.loads(response.read())
            stats = doc["model_stats"][0]["batch_stats"]
            return {int(s["batch_size"]): (int(s["compute_infer"]["count"]), int(s["compute_infer"]["ns"]))
                    for s in stats}
        except (OSError, ValueError, KeyError, IndexError):
            return None

    def start(self) -> None:
        self.stats0 = self._batch_stats()
        self.before = self._scrape()
        for extra in self.extras:
            extra.start()
        self.cpu0 = self.service.cpu_seconds()
        self.busy0, self.self0, self.t0 = system_busy_s(), _self_cpu_s(), time.perf_counter()

    def end(self) -> None:
        self.busy1, self.self1, self.t1 = system_busy_s(), _self_cpu_s(), time.perf_counter()
        self.cpu1 = self.service.cpu_seconds()
        for extra in self.extras:
            extra.end()
        self.after = self._scrape()
        self.stats1 = self._batch_stats()

    def result(self, load: LoadResult) -> dict[str, Any]:
        wall = self.t1 - self.t0
        by_role: dict[str, float] = {}
        by_process: dict[str, dict[str, Any]] = {}
        for pid, (role, seconds) in self.cpu1.items():
            previous = self.cpu0.get(pid, (role, 0.0))[1]
            by_role[role] = by_role.get(role, 0.0) + max(0.0, seconds - previous)
            by_process[str(pid)] = {"role": role, "cpu_s": round(max(0.0, seconds - previous), 4)}
        server_s = sum(by_role.values())
        out: dict[str, Any] = {
            "server_cpu_pct": server_s / wall * 100.0,
            "server_cpu_pct_by_role": {k: round(v / wall * 100.0, 1) for k, v in sorted(by_role.items())},
            "server_cpu_us_per_request": server_s / load.requests * 1e6 if load.requests else None,
            # Per role, all its processes summed (several gateways: their sum): what one request costs each role.
            "server_cpu_us_per_request_by_role": {k: round(v / load.requests * 1e6, 1)
                                                  for k, v in sorted(by_role.items())} if load.requests else {},
            "cpu_by_process": by_process,
            # The busiest process bounds throughput when it has a core to itself: 1e6 / this = its req/s.
            "busiest_process": max(by_role, key=by_role.get) if by_role else None,
            "busiest_cpu_us_per_request": max(by_role.values()) / load.requests * 1e6
            if by_role and load.requests else None,
            "metrics_error": self.metrics_error,
        }
        if self.busy0 is not None and self.busy1 is not None:
            # (wrk and perf_analyzer are child processes; the Python generators run in this one)
            child = load.generator in ("wrk", "perf_analyzer")
            ours = server_s + (self.self1 - self.self0) + (load.gen_cpu_s if child else 0.0)
            out["machine_busy_pct"] = (self.busy1 - self.busy0) / wall * 100.0
            out["foreign_cpu_pct"] = max(0.0, (self.busy1 - self.busy0) - ours) / wall * 100.0
        out.update(counters_delta(self.before, self.after))
        if self.stats0 is not None and self.stats1:
            sizes = {}
            for size, (count, ns) in self.stats1.items():
                count0, ns0 = self.stats0.get(size, (0, 0))
                if count > count0:
                    sizes[str(size)] = {"batches": count - count0, "compute_ms": (ns - ns0) / (count - count0) / 1e6}
            out["batch_sizes"] = sizes  # exact, per size (None when the server does not report them)
        for extra in self.extras:
            out.update(extra.result(load, self))
        return out


def measure(case: Case, *, mode: Literal["closed", "open"], level: float, duration_s: float, warmup_s: float,
            generator: Generator, request_timeout_s: float, wrk_threads: int = 1) -> dict[str, Any]:
    """One run of one case at one level (clients, or arrivals/s in open loop)."""
    service = case.service
    if service.process is None or service.process.poll() is not None:
        return {"failed": f"{service.name} is not running (log: {service.log_path})"}
    window = ServiceWindow(service, case.model, case.extras)
    common = {"duration_s": duration_s, "warmup_s": warmup_s, "window": window,
              "request_timeout_s": request_timeout_s}
    if mode == "closed" and case.load is not None:
        load = case.load(concurrency=int(level), **common)
    elif mode == "open":
        load = run_open_loop(service.infer_url, case.payload, rate=level, **common)
    elif generator == "wrk":
        load = run_wrk(service.infer_url, case.payload, concurrency=int(level), threads=wrk_threads, **common)
    else:
        load = run_load(service.infer_url, case.payload, concurrency=int(level), **common)
    run = {**load.to_json(), **window.result(load)}
    run["rows_per_s"] = (run["rps"] or 0.0) * case.payload.rows_per_request
    try:
        run["memory"] = service.memory()
    except ServerError as exc:  # pragma: no cover - memory is best effort
        run["memory"] = {"error": str(exc)}
    return run


@dataclass(frozen=True)
class Quiet:
    """Before each run, wait up to max_wait_s for the machine to be under busy_limit_pct busy; a run
    during which other processes used more than max_foreign_pct of a core is kept in the JSON,
    marked discarded, and measured again (at most `retries` times)."""

    max_wait_s: float = 0.0
    busy_limit_pct: float = 15.0
    max_foreign_pct: float | None = None
    retries: int = 0


def run_matrix(cases: Sequence[Case], levels: Sequence[float], *, mode: Literal["closed", "open"] = "closed",
               repeats: int, duration_s: float, warmup_s: float, generator: Generator,
               request_timeout_s: float = 30.0, level_for: Callable[[Case, float], float] | None = None,
               quiet: Quiet = Quiet(), progress: Callable[[str], None] = log.info,
               wrk_threads: int = 1, sink: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every case at every level, `repeats` times, interleaved; one dict per run.

    sink: the list the runs are appended to as they finish (so that a caller stopped half-way, by a
    timeout's SIGTERM, still has the runs done so far); by default a new one."""
    runs = sink if sink is not None else []
    total = repeats * len(levels) * len(cases)
    done = 0
    for repeat in range(repeats):
        for level in levels:
            shift = repeat % len(cases)
            for case in [*cases[shift:], *cases[:shift]]:
                done += 1
                actual = level_for(case, level) if level_for else level
                for attempt in range(quiet.retries + 1):
                    before = wait_for_quiet(quiet.max_wait_s, quiet.busy_limit_pct) if quiet.max_wait_s > 0 else {}
                    run = {"case": case.name, "repeat": repeat, "mode": mode, "level": actual, "attempt": attempt,
                           **before, **measure(case, mode=mode, level=actual, duration_s=duration_s,
                                               warmup_s=warmup_s, generator=generator,
                                               request_timeout_s=request_timeout_s, wrk_threads=wrk_threads)}
                    noisy = (quiet.max_foreign_pct is not None
                             and (run.get("foreign_cpu_pct") or 0.0) > quiet.max_foreign_pct)
                    if noisy and attempt < quiet.retries:
                        run["discarded"] = f"foreign CPU {run['foreign_cpu_pct']:.0f}% > {quiet.max_foreign_pct:g}%"
                    elif noisy:
                        run["noisy"] = True  # the last attempt is kept; summaries prefer quiet repeats
                    runs.append(run)
                    progress(describe_run(done, total, run))
                    if "discarded" not in run:
                        break
    return runs


def describe_run(done: int, total: int, run: dict[str, Any]) -> str:
    if "failed" in run:
        return f"[{done}/{total}] {run['case']}: FAILED {run['failed']}"
    note = f"  DISCARDED ({run['discarded']}), again" if run.get("discarded") else ""
    level = f"{run['level']:g} clients" if run["mode"] == "closed" else f"{run['level']:.0f}/s open"
    batch = run.get("mean_batch")
    return (f"[{done}/{total}] {run['case']:<16} {level:>12}: {run['rps'] or 0:8.0f} req/s"
            f"  p50 {run['p50_ms'] or 0:7.2f}"
            f"  p99 {run['p99_ms'] or 0:8.2f} ms  err {run['errors']}  batch {'-' if batch is None else f'{batch:.1f}'}"
            f"  server CPU {run.get('server_cpu_pct', 0):.0f}%  gen CPU {run['gen_cpu_pct'] or 0:.0f}%"
            f"  foreign {run.get('foreign_cpu_pct', math.nan):.0f}%{note}")


# -- summaries ------------------------------------------------------------------------------
MEDIAN_KEYS = ("rps", "rows_per_s", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "mean_batch", "gen_cpu_pct",
               "server_cpu_pct", "server_cpu_us_per_request", "busiest_cpu_us_per_request", "foreign_cpu_pct",
               "compute_ms_per_batch",
               "padding_waste", "efficiency", "ceiling_items_per_s")


def summarize(case: str, level: float, runs: Sequence[dict[str, Any]], mode: str = "closed") -> dict[str, Any]:
    """Median of each MEDIAN_KEYS value over `runs` (each key on its own), errors summed, and the
    run with the median throughput (its CDF is what the plots draw)."""
    kept = [r for r in runs if not r.get("discarded")]
    measured = [r for r in kept if "failed" not in r]
    # Repeats measured while other processes were busy (noisy) count only when no quiet one exists.
    ok = [r for r in measured if not r.get("noisy")] or measured
    summary: dict[str, Any] = {"case": case, "mode": mode, "level": level, "repeats": len(kept),
                               "used_runs": len(ok), "failed_runs": len(kept) - len(measured),
                               "discarded_runs": len(runs) - len(kept)}
    if mode == "closed":
        summary["clients"] = int(level)
    for key in MEDIAN_KEYS:
        value = median([r.get(key) for r in ok])
        summary[key] = None if math.isnan(value) else value
    summary["errors"] = sum(int(r.get("errors") or 0) for r in measured)  # every repeat's, noisy or not
    for key in ("rss_mib", "pss_mib", "uss_mib"):
        values = [r["memory"][key] for r in ok if isinstance(r.get("memory"), dict) and key in r["memory"]]
        summary[key] = max(values) if values else None
    if ok:
        by_rps = sorted(ok, key=lambda r: r.get("rps") or 0.0)
        summary["cdf"] = by_rps[len(by_rps) // 2].get("cdf")
    return summary


def summarize_all(runs: Sequence[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    keys: list[tuple[str, str, float]] = []
    for run in runs:
        key = (run["mode"], run["case"], run["level"])
        if key not in keys:
            keys.append(key)
    # Order: mode, then level, then the cases in their given order.
    case_order = list(labels)
    keys.sort(key=lambda k: (k[0] != "closed", k[2] if k[0] == "closed" else 0,
                             case_order.index(k[1]) if k[1] in case_order else 99, k[2]))
    rows = []
    for mode, case, level in keys:
        group = [r for r in runs if (r["mode"], r["case"], r["level"]) == (mode, case, level)]
        rows.append({"label": labels.get(case, case), **summarize(case, level, group, mode)})
    return rows
