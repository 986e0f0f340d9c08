"""Closed-loop HTTP load generator for a KServe v2 `infer` endpoint (asyncio + aiohttp).

C clients each own one keep-alive connection (TCPConnector(limit=C)) and send the same
pre-encoded body back to back: a client sends its next request as soon as the previous
answer arrived, so the offered load is C requests in flight, never more.

Timeline of one run: warm-up [start, t0), measurement window [t0, t_end], tail (requests
still in flight at t_end are finished but not measured). Throughput and latencies use the
requests *completed* inside the window. Errors are counted in every phase and reported;
nothing is dropped silently.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import re
import resource
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

BODY_SEED = 20240601
ERROR_SAMPLES_KEPT = 5


# -- statistics -----------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) with linear interpolation between closest ranks.

    The same definition as numpy.percentile's default ("linear"): rank = q/100 * (n-1).
    NaN for an empty sequence.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be within 0..100, got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = q / 100.0 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    """Median, NaNs and Nones ignored; NaN when nothing is left."""
    kept = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return percentile(kept, 50.0)


# -- request body ---------------------------------------------------------------------------
def make_infer_body(input_name: str = "x", width: int = 512, seed: int = BODY_SEED) -> bytes:
    """KServe v2 JSON body with one row of `width` random (but seed-fixed) FP32 values."""
    rng = random.Random(seed)
    data = [round(rng.gauss(0.0, 1.0), 6) for _ in range(width)]
    doc = {"inputs": [{"name": input_name, "shape": [1, width], "datatype": "FP32", "data": data}]}
    return json.dumps(doc, separators=(",", ":")).encode()


# -- Prometheus text ------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(metric name, frozenset of label pairs): value} for every sample line of a scrape."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples[(name, frozenset(_LABEL.findall(labels or "")))] = number
    return samples


def metric_sum(samples: Mapping[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels` (0.0 when none match)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


@dataclass(frozen=True)
class ServerCounters:
    """The gateway's counters that a run's delta is taken of."""

    batch_rows: float  # ringserve_batch_size_sum
    batches: float  # ringserve_batch_size_count
    requests_by_code: dict[str, float]  # ringserve_requests_total by HTTP code

    @classmethod
    def from_text(cls, text: str, model: str) -> ServerCounters:
        samples = parse_prometheus(text)
        codes: dict[str, float] = {}
        for (name, labels), value in samples.items():
            label_map = dict(labels)
            if name == "ringserve_requests_total" and label_map.get("model") == model:
                codes[label_map.get("code", "?")] = codes.get(label_map.get("code", "?"), 0.0) + value
        return cls(batch_rows=metric_sum(samples, "ringserve_batch_size_sum", model=model),
                   batches=metric_sum(samples, "ringserve_batch_size_count", model=model),
                   requests_by_code=codes)


def counters_delta(before: ServerCounters | None, after: ServerCounters | None) -> dict[str, Any]:
    """Batches, rows and mean batch size formed between two scrapes (None where unknown)."""
    if before is None or after is None:
        return {"batches": None, "batch_rows": None, "mean_batch": None, "server_requests_by_code": None}
    batches = after.batches - before.batches
    rows = after.batch_rows - before.batch_rows
    codes = {code: after.requests_by_code.get(code, 0.0) - before.requests_by_code.get(code, 0.0)
             for code in sorted(set(before.requests_by_code) | set(after.requests_by_code))}
    return {"batches": batches, "batch_rows": rows, "mean_batch": rows / batches if batches > 0 else None,
            "server_requests_by_code": {c: v for c, v in codes.items() if v}}


# -- the load run ---------------------------------------------------------------------------
@dataclass
class LoadResult:
    clients: int
    window_s: float  # measured wall time (t0 .. t_end)
    requests: int  # 200s completed inside the window
    rps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    errors: int  # every failed request, any phase (warm-up, window, tail)
    errors_in_window: int
    errors_by_kind: dict[str, int]  # "http_503", "ClientConnectorError", ..., any phase
    error_samples: list[str]
    warmup_requests: int
    tail_requests: int
    gen_cpu_s: float  # CPU (user + system) this process used in the window
    gen_user_s: float
    gen_sys_s: float
    gen_cpu_pct: float  # gen_cpu_s / window_s * 100; 100 = one core busy
    batches: float | None
    batch_rows: float | None
    mean_batch: float | None
    server_requests_by_code: dict[str, float] | None
    metrics_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


@dataclass
class _State:
    t0: float
    t_end: float
    latencies: list[float] = field(default_factory=list)
    warmup_requests: int = 0
    tail_requests: int = 0
    errors: Counter = field(default_factory=Counter)
    errors_in_window: int = 0
    error_samples: list[str] = field(default_factory=list)

    def error(self, kind: str, t_done: float, detail: str) -> None:
        self.errors[kind] += 1
        if self.t0 <= t_done <= self.t_end:
            self.errors_in_window += 1
        if len(self.error_samples) < ERROR_SAMPLES_KEPT:
            self.error_samples.append(f"{kind}: {detail[:200]}")


async def _client(session: aiohttp.ClientSession, url: str, body: bytes, state: _State) -> None:
    headers = {"content-type": "application/json"}
    while True:
        t_start = time.perf_counter()
        if t_start >= state.t_end:
            return
        try:
            async with session.post(url, data=body, headers=headers) as response:
                payload = await response.read()
                status = response.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            state.error(type(exc).__name__, time.perf_counter(), str(exc))
            await asyncio.sleep(0.01)  # a refused connection must not turn the client into a busy loop
            continue
        t_done = time.perf_counter()
        if status != 200 or b'"outputs"' not in payload:
            state.error(f"http_{status}", t_done, payload.decode(errors="replace"))
        elif t_done < state.t0:
            state.warmup_requests += 1
        elif t_done > state.t_end:
            state.tail_requests += 1
        else:
            state.latencies.append(t_done - t_start)


async def _scrape(session: aiohttp.ClientSession, metrics_url: str, model: str) -> ServerCounters:
    async with session.get(metrics_url) as response:
        response.raise_for_status()
        return ServerCounters.from_text(await response.text(), model)


def _cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


async def run_load_async(base_url: str, model: str, body: bytes, *, concurrency: int, duration_s: float,
                         warmup_s: float, request_timeout_s: float = 30.0) -> LoadResult:
    if concurrency < 1 or duration_s <= 0 or warmup_s < 0:
        raise ValueError(f"need concurrency >= 1, duration_s > 0, warmup_s >= 0; "
                         f"got {concurrency}, {duration_s}, {warmup_s}")
    base_url = base_url.rstrip("/")
    url = f"{base_url}/v2/models/{model}/infer"
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    start = time.perf_counter()
    state = _State(t0=start + warmup_s, t_end=start + warmup_s + duration_s)
    metrics_error = None
    before = after = None
    # /metrics goes through its own connection, so it never takes a client's slot.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout) as session, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=timeout) as side:
        clients = [asyncio.create_task(_client(session, url, body, state)) for _ in range(concurrency)]
        try:
            await asyncio.sleep(max(0.0, state.t0 - time.perf_counter()))
            wall0, cpu0 = time.perf_counter(), _cpu()
            try:
                before = await _scrape(side, f"{base_url}/metrics", model)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                metrics_error = f"before: {exc!r}"
            await asyncio.sleep(max(0.0, state.t_end - time.perf_counter()))
            wall1, cpu1 = time.perf_counter(), _cpu()
            try:
                after = await _scrape(side, f"{base_url}/metrics", model)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                metrics_error = (metrics_error + "; " if metrics_error else "") + f"after: {exc!r}"
            await asyncio.gather(*clients)
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)

    window = wall1 - wall0
    user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    lat_ms = [s * 1000.0 for s in state.latencies]
    return LoadResult(
        clients=concurrency, window_s=window, requests=len(lat_ms),
        rps=len(lat_ms) / window if window > 0 else math.nan,
        p50_ms=percentile(lat_ms, 50), p99_ms=percentile(lat_ms, 99),
        mean_ms=sum(lat_ms) / len(lat_ms) if lat_ms else math.nan, max_ms=max(lat_ms, default=math.nan),
        errors=sum(state.errors.values()), errors_in_window=state.errors_in_window,
        errors_by_kind=dict(state.errors), error_samples=state.error_samples,
        warmup_requests=state.warmup_requests, tail_requests=state.tail_requests,
        gen_cpu_s=user + system, gen_user_s=user, gen_sys_s=system,
        gen_cpu_pct=(user + system) / window * 100.0 if window > 0 else math.nan,
        metrics_error=metrics_error, **counters_delta(before, after))


def run_load(base_url: str, model: str, body: bytes, **kwargs: Any) -> LoadResult:
    """Synchronous wrapper of run_load_async (one fresh event loop per run)."""
    return asyncio.run(run_load_async(base_url, model, body, **kwargs))
