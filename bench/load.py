"""Load generators for a KServe v2 `infer` endpoint, asyncio + aiohttp (wrk is in bench/wrk.py).

Closed loop (`run_load_async`): C clients each own one keep-alive connection and send back to
back, so the offered load is C requests in flight, never more. Open loop (`run_open_loop_async`):
requests arrive as a Poisson process at a given rate whatever the server does, and each one's
latency is measured from its *scheduled* arrival, so queueing delay (and a generator that falls
behind) shows in the numbers instead of being hidden by a slowed-down client.

Timeline of one run: warm-up [start, t0), measurement window [t0, t_end], tail (requests still
in flight at t_end are finished but not measured). Throughput and latencies use the requests
*completed* inside the window. Errors are counted in every phase and reported; nothing is
dropped silently. `window.start()` / `window.end()` (server CPU, /metrics) run at t0 and t_end
in a thread, so the clients keep going while they run.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import re
import resource
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import aiohttp

BODY_SEED = 20240601
ERROR_SAMPLES_KEPT = 5
CDF_PERCENTILES = (1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97.5, 99, 99.5, 99.9, 99.99, 100)


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


def cdf_points(latencies_ms: Sequence[float]) -> list[list[float]]:
    """[[percentile, ms], ...] at CDF_PERCENTILES: what the latency CDF plot draws."""
    ordered = sorted(latencies_ms)
    return [[q, percentile(ordered, q)] for q in CDF_PERCENTILES] if ordered else []


# -- request bodies ---------------------------------------------------------------------------
def make_infer_body(input_name: str = "x", width: int = 512, seed: int = BODY_SEED,
                    decimals: int | None = None) -> bytes:
    """KServe v2 JSON body with one row of `width` seed-fixed FP32 values.

    By default the values are what a Python client sends for a float32 numpy row
    (`row.tolist()` then `json.dumps`): each float32 widened to a double and written with
    repr's 17 significant digits, ~10 KB for 512 values. `decimals` rounds them instead
    (6 gives a ~5 KB body, as a client that formats its numbers would send).
    """
    import numpy as np

    row = np.random.default_rng(seed).standard_normal(width).astype(np.float32).tolist()
    if decimals is not None:
        row = [round(v, decimals) for v in row]
    doc = {"inputs": [{"name": input_name, "shape": [1, width], "datatype": "FP32", "data": row}]}
    return json.dumps(doc).encode()


def make_binary_infer_body(input_name: str = "x", width: int = 512, seed: int = BODY_SEED,
                           output_name: str = "y") -> tuple[bytes, dict[str, str]]:
    """The same row as make_infer_body, in the KServe binary tensor extension, answer asked in binary.

    Returns (body, headers): the JSON header, then 4 * width little-endian FP32 bytes.
    """
    import numpy as np

    row = np.random.default_rng(seed).standard_normal(width).astype("<f4")
    header = json.dumps({"inputs": [{"name": input_name, "shape": [1, width], "datatype": "FP32",
                                     "parameters": {"binary_data_size": row.nbytes}}],
                         "outputs": [{"name": output_name, "parameters": {"binary_data": True}}]}).encode()
    return header + row.tobytes(), {"inference-header-content-length": str(len(header))}


@dataclass(frozen=True)
class Payload:
    """The bodies a run sends, in a fixed cycle (one body for most runs, a length mix for encoder)."""

    bodies: tuple[bytes, ...]
    content_type: str = "application/json"
    headers: tuple[dict[str, str], ...] = ()  # per body, e.g. Inference-Header-Content-Length
    rows_per_request: int = 1
    description: str = ""

    @classmethod
    def single(cls, body: bytes, **kwargs: Any) -> Payload:
        return cls(bodies=(body,), **kwargs)

    def headers_of(self, index: int) -> dict[str, str]:
        extra = self.headers[index] if self.headers else {}
        return {"content-type": self.content_type, **extra}

    def describe(self) -> dict[str, Any]:
        sizes = [len(b) for b in self.bodies]
        return {"bodies": len(sizes), "bytes_mean": sum(sizes) / len(sizes), "bytes_max": max(sizes),
                "content_type": self.content_type, "rows_per_request": self.rows_per_request,
                "description": self.description}


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
    batch_buckets: dict[str, float] = field(default_factory=dict)  # cumulative, by `le`
    compute_s: float = 0.0  # ringserve_compute_seconds_sum
    real_elements: float = 0.0
    padded_elements: float = 0.0
    restarts: float = 0.0  # ringserve_worker_restarts_total, every worker and reason

    @classmethod
    def from_text(cls, text: str, model: str) -> ServerCounters:
        samples = parse_prometheus(text)
        codes: dict[str, float] = {}
        buckets: dict[str, float] = {}
        for (name, labels), value in samples.items():
            label_map = dict(labels)
            if label_map.get("model") != model:
                continue
            if name == "ringserve_requests_total":
                code = label_map.get("code", "?")
                codes[code] = codes.get(code, 0.0) + value
            elif name == "ringserve_batch_size_bucket":
                buckets[label_map.get("le", "?")] = value
        return cls(batch_rows=metric_sum(samples, "ringserve_batch_size_sum", model=model),
                   batches=metric_sum(samples, "ringserve_batch_size_count", model=model),
                   requests_by_code=codes, batch_buckets=buckets,
                   compute_s=metric_sum(samples, "ringserve_compute_seconds_sum", model=model),
                   real_elements=metric_sum(samples, "ringserve_real_elements_total", model=model),
                   padded_elements=metric_sum(samples, "ringserve_padded_elements_total", model=model),
                   restarts=metric_sum(samples, "ringserve_worker_restarts_total"))


def _le_key(le: str) -> float:
    return math.inf if le == "+Inf" else float(le)


def batch_histogram(buckets: Mapping[str, float]) -> list[list]:
    """Cumulative `le` buckets -> [[low, high, batches], ...] for the non-empty ranges."""
    ranges, previous_le, previous_count = [], 0.0, 0.0
    for le in sorted(buckets, key=_le_key):
        count = buckets[le] - previous_count
        high = _le_key(le)
        if count > 0:
            ranges.append([previous_le, None if math.isinf(high) else high, count])
        previous_le, previous_count = high, buckets[le]
    return ranges


def counters_delta(before: ServerCounters | None, after: ServerCounters | None) -> dict[str, Any]:
    """What the server did between two scrapes: batches, rows, mean batch, histogram, waste."""
    if before is None or after is None:
        return {"batches": None, "batch_rows": None, "mean_batch": None, "server_requests_by_code": None,
                "batch_histogram": None, "compute_ms_per_batch": None, "padding_waste": None}
    batches = after.batches - before.batches
    rows = after.batch_rows - before.batch_rows
    codes = {code: after.requests_by_code.get(code, 0.0) - before.requests_by_code.get(code, 0.0)
             for code in sorted(set(before.requests_by_code) | set(after.requests_by_code))}
    buckets = {le: after.batch_buckets.get(le, 0.0) - before.batch_buckets.get(le, 0.0) for le in after.batch_buckets}
    real = after.real_elements - before.real_elements
    padded = after.padded_elements - before.padded_elements
    return {"batches": batches, "batch_rows": rows, "mean_batch": rows / batches if batches > 0 else None,
            "server_requests_by_code": {c: v for c, v in codes.items() if v},
            "batch_histogram": batch_histogram(buckets),
            "compute_ms_per_batch": (after.compute_s - before.compute_s) / batches * 1e3 if batches > 0 else None,
            "real_elements": real, "padded_elements": padded,
            "padding_waste": padded / real if real > 0 else None,
            "restarts": after.restarts - before.restarts}


# -- what one run returns -------------------------------------------------------------------
class Window(Protocol):
    """Called at the start and the end of the measurement window (server CPU, /metrics, ...)."""

    def start(self) -> None: ...

    def end(self) -> None: ...


class NoWindow:
    def start(self) -> None:
        pass

    def end(self) -> None:
        pass


@dataclass
class LoadResult:
    generator: str  # "aiohttp" | "wrk"
    mode: str  # "closed" | "open"
    clients: int  # closed loop: connections; open loop: the connection pool's limit
    window_s: float  # measured wall time (t0 .. t_end)
    requests: int  # 2xx answers completed inside the window
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    cdf: list  # [[percentile, ms], ...]
    errors: int  # every failed request, any phase (warm-up, window, tail)
    errors_by_kind: dict[str, int]  # "http_503", "ClientConnectorError", ..., any phase
    error_samples: list[str]
    gen_cpu_s: float  # CPU (user + system) the generator used in the window
    gen_cpu_pct: float  # gen_cpu_s / window_s * 100; 100 = one core busy
    warmup_requests: int = 0
    tail_requests: int = 0
    rate: float | None = None  # open loop: the offered arrivals per second
    sent_late_ms_p99: float | None = None  # open loop: how far behind schedule requests left

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
    error_samples: list[str] = field(default_factory=list)
    late: list[float] = field(default_factory=list)

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.error_samples) < ERROR_SAMPLES_KEPT:
            self.error_samples.append(f"{kind}: {detail[:200]}")

    def answered(self, t_from: float, t_done: float, status: int, payload: bytes) -> None:
        if status != 200:
            self.error(f"http_{status}", payload.decode(errors="replace"))
        elif t_done < self.t0:
            self.warmup_requests += 1
        elif t_done > self.t_end:
            self.tail_requests += 1
        else:
            self.latencies.append(t_done - t_from)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _result(state: _State, generator: str, mode: str, clients: int, window_s: float, cpu_s: float,
            **extra: Any) -> LoadResult:
    lat_ms = [s * 1000.0 for s in state.latencies]
    return LoadResult(
        generator=generator, mode=mode, clients=clients, window_s=window_s, requests=len(lat_ms),
        rps=len(lat_ms) / window_s if window_s > 0 else math.nan,
        p50_ms=percentile(lat_ms, 50), p90_ms=percentile(lat_ms, 90), p99_ms=percentile(lat_ms, 99),
        mean_ms=sum(lat_ms) / len(lat_ms) if lat_ms else math.nan, max_ms=max(lat_ms, default=math.nan),
        cdf=cdf_points(lat_ms), errors=sum(state.errors.values()), errors_by_kind=dict(state.errors),
        error_samples=state.error_samples, gen_cpu_s=cpu_s,
        gen_cpu_pct=cpu_s / window_s * 100.0 if window_s > 0 else math.nan,
        warmup_requests=state.warmup_requests, tail_requests=state.tail_requests, **extra)


async def _post(session: aiohttp.ClientSession, url: str, payload: Payload, index: int) -> tuple[int, bytes]:
    async with session.post(url, data=payload.bodies[index], headers=payload.headers_of(index)) as response:
        return response.status, await response.read()


async def _measure(state: _State, window: Window) -> tuple[float, float]:
    """Sleep through warm-up and window, calling the window hooks; (window seconds, generator CPU)."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, state.t0 - time.perf_counter()))
    wall0, cpu0 = time.perf_counter(), _cpu()
    await loop.run_in_executor(None, window.start)
    await asyncio.sleep(max(0.0, state.t_end - time.perf_counter()))
    wall1, cpu1 = time.perf_counter(), _cpu()
    await loop.run_in_executor(None, window.end)
    return wall1 - wall0, cpu1 - cpu0


# -- closed loop ----------------------------------------------------------------------------
async def _client(session: aiohttp.ClientSession, url: str, payload: Payload, state: _State,
                  order: itertools.count) -> None:
    while True:
        t_start = time.perf_counter()
        if t_start >= state.t_end:
            return
        try:
            status, body = await _post(session, url, payload, next(order) % len(payload.bodies))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            state.error(type(exc).__name__, str(exc))
            await asyncio.sleep(0.01)  # a refused connection must not turn the client into a busy loop
            continue
        state.answered(t_start, time.perf_counter(), status, body)


async def run_load_async(url: str, payload: Payload, *, concurrency: int, duration_s: float, warmup_s: float,
                         window: Window | None = None, request_timeout_s: float = 30.0) -> LoadResult:
    """Closed loop: `concurrency` clients, one keep-alive connection each, back to back."""
    if concurrency < 1 or duration_s <= 0 or warmup_s < 0:
        raise ValueError(f"need concurrency >= 1, duration_s > 0, warmup_s >= 0; "
                         f"got {concurrency}, {duration_s}, {warmup_s}")
    window = window or NoWindow()
    start = time.perf_counter()
    state = _State(t0=start + warmup_s, t_end=start + warmup_s + duration_s)
    order = itertools.count()
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout) as session:
        clients = [asyncio.create_task(_client(session, url, payload, state, order)) for _ in range(concurrency)]
        try:
            window_s, cpu_s = await _measure(state, window)
            await asyncio.gather(*clients)
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
    return _result(state, "aiohttp", "closed", concurrency, window_s, cpu_s)


# -- gRPC, closed loop ------------------------------------------------------------------------
async def _grpc_client(call, body: bytes, state: _State, timeout_s: float) -> None:
    import grpc

    while True:
        t_start = time.perf_counter()
        if t_start >= state.t_end:
            return
        try:
            answer = await call(body, timeout=timeout_s)
        except grpc.RpcError as exc:
            state.error(f"grpc_{exc.code().name}", exc.details() or "")
            await asyncio.sleep(0.01)  # a refused connection must not turn the client into a busy loop
            continue
        state.answered(t_start, time.perf_counter(), 200, answer)


async def run_grpc_load_async(target: str, method: str, body: bytes, *, concurrency: int, duration_s: float,
                              warmup_s: float, window: Window | None = None,
                              request_timeout_s: float = 30.0) -> LoadResult:
    """Closed loop over gRPC: `concurrency` clients, each on a channel (HTTP/2 connection) of its own, as
    each wrk/aiohttp client has its own keep-alive connection. Each sends the request's bytes serialized
    once and takes the answer's bytes unparsed, as wrk does: the client's own cost is grpc.aio's."""
    import grpc

    window = window or NoWindow()
    # A local subchannel pool each: channels to one target would otherwise share one connection.
    channels = [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1),
                                                           ("grpc.max_receive_message_length", -1)])
                for _ in range(concurrency)]
    try:
        calls = [c.unary_unary(method, request_serializer=None, response_deserializer=None) for c in channels]
        await asyncio.gather(*(c.channel_ready() for c in channels))
        start = time.perf_counter()
        state = _State(t0=start + warmup_s, t_end=start + warmup_s + duration_s)
        clients = [asyncio.create_task(_grpc_client(call, body, state, request_timeout_s)) for call in calls]
        try:
            window_s, cpu_s = await _measure(state, window)
            await asyncio.gather(*clients)
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
    finally:
        await asyncio.gather(*(c.close() for c in channels))
    return _result(state, "grpc.aio", "closed", concurrency, window_s, cpu_s)


def run_grpc_load(target: str, method: str, body: bytes, **kwargs: Any) -> LoadResult:
    return asyncio.run(run_grpc_load_async(target, method, body, **kwargs))


# -- open loop ------------------------------------------------------------------------------
async def _arrival(session: aiohttp.ClientSession, url: str, payload: Payload, state: _State, t_due: float,
                   index: int) -> None:
    state.late.append(time.perf_counter() - t_due)
    try:
        status, body = await _post(session, url, payload, index)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        state.error(type(exc).__name__, str(exc))
        return
    state.answered(t_due, time.perf_counter(), status, body)


async def run_open_loop_async(url: str, payload: Payload, *, rate: float, duration_s: float, warmup_s: float,
                              window: Window | None = None, max_connections: int = 256, seed: int = BODY_SEED,
                              request_timeout_s: float = 30.0) -> LoadResult:
    """Open loop: Poisson arrivals at `rate` per second; latency counted from the scheduled arrival.

    Arrivals beyond `max_connections` in flight wait for a connection, and that wait counts.
    """
    if rate <= 0 or duration_s <= 0 or warmup_s < 0:
        raise ValueError(f"need rate > 0, duration_s > 0, warmup_s >= 0; got {rate}, {duration_s}, {warmup_s}")
    window = window or NoWindow()
    rng = random.Random(seed)
    start = time.perf_counter()
    state = _State(t0=start + warmup_s, t_end=start + warmup_s + duration_s)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    tasks: set[asyncio.Task] = set()

    async def schedule() -> None:
        t_due, index = start, 0
        while True:
            t_due += rng.expovariate(rate)
            if t_due >= state.t_end:
                return
            delay = t_due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(_arrival(session, url, payload, state, t_due, index % len(payload.bodies)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max_connections),
                                     timeout=timeout) as session:
        scheduler = asyncio.create_task(schedule())
        try:
            window_s, cpu_s = await _measure(state, window)
            await scheduler
            if tasks:
                await asyncio.wait(list(tasks), timeout=request_timeout_s)
        finally:
            scheduler.cancel()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(scheduler, *tasks, return_exceptions=True)
    late_ms = [s * 1000.0 for s in state.late]
    return _result(state, "aiohttp", "open", max_connections, window_s, cpu_s, rate=rate,
                   sent_late_ms_p99=percentile(late_ms, 99) if late_ms else None)


def run_load(url: str, payload: Payload, **kwargs: Any) -> LoadResult:
    """Synchronous wrapper of run_load_async (one fresh event loop per run)."""
    return asyncio.run(run_load_async(url, payload, **kwargs))


def run_open_loop(url: str, payload: Payload, **kwargs: Any) -> LoadResult:
    return asyncio.run(run_open_loop_async(url, payload, **kwargs))
