"""Triton's per-request latency families that `--metrics-config` turns on (common/metrics_config.py):

    nv_inference_first_response_histogram_ms  histogram_latencies=true: per request, arrival to its first
        response, in whole ms (Triton's integer division), Triton's buckets 100, 500, 2000, 5000 or the
        config's `model_metrics` ones. A
        decoupled model's first streamed response (outputs or error: gateway/dispatch/replies.py's
        on_stream); another model's answer, when it succeeds (record_success).
    nv_inference_{request,queue,compute_input,compute_infer,compute_output}_summary_us
        summary_latencies=true: per successful request, the same five times the statistics add up
        (gateway/observe/stats.py), in whole µs. `_count` and `_sum` since the start; the quantiles over
        the last summary_max_age seconds, sliding in summary_age_buckets steps (prometheus-cpp's
        TimeWindowQuantiles, which Triton's are).

Each gateway observes its own requests, and one scrape of any gateway is the whole server's
(gateway/cluster/merge.py adds the gateways' samples up): the histogram and the summaries' count and sum
add up as they are. Quantiles do not, so a gateway's `?scope=gateway` share carries its window as a
mergeable sketch instead (WINDOW, a gauge per log-spaced bucket: ln(v) / ln(γ) rounded up, γ = 1.01 / 0.99,
so a bucket's middle is within 1% of every value in it), the merge adds the gateways' sketches, and
`finish` turns the sum into the quantile samples (the nearest rank's bucket, clamped to the window's
smallest and largest value) and drops it. The window's steps are wall-clock multiples of
max_age / age_buckets, the same in every gateway, so the sketches added cover the same time.
Triton's CKMS quantiles have a rank error (the `error` of each pair); these have a value error under 1%
(and the pair's error is not used).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import Metric

from ringserve.common.metrics_config import MetricsConfig
from ringserve.gateway.observe.model_metrics import prometheus_value

FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)  # Triton's (metric_model_reporter.h)
# (stage, family, help), Triton's names and help (core src/metrics.cc)
SUMMARIES = (
    (
        "request",
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
    ),
    (
        "queue",
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "compute_input",
        "nv_inference_compute_input_summary_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "compute_infer",
        "nv_inference_compute_infer_summary_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "compute_output",
        "nv_inference_compute_output_summary_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
)
# Only in a gateway's own share (`finish` consumes them): the sketches' counts, added up by the merge, and
# their extremes (-smallest and largest), which the merge takes at their highest (merge.py's BROADCAST).
STAGES = tuple(stage for stage, _, _ in SUMMARIES)
WINDOW = "ringserve_summary_window"
WINDOW_BOUNDS = "ringserve_summary_window_bounds"
LATENCY_FAMILIES = frozenset({FIRST_RESPONSE, *(name for _, name, _ in SUMMARIES)})
_GAMMA = 1.01 / 0.99
_LN_GAMMA = math.log(_GAMMA)
_INV_LN_GAMMA = 1 / _LN_GAMMA
_ZERO = -1  # the bucket of 0 µs
_MIN, _MAX = "min", "max"


class Sketch:
    """Counts per log-spaced bucket, and the smallest and largest value: added up across gateways."""

    __slots__ = ("counts", "low", "high")

    def __init__(self) -> None:
        self.counts: dict[int, float] = {}
        self.low = math.inf
        self.high = -math.inf

    def add(self, value: float) -> None:
        key = math.ceil(math.log(value) * _INV_LN_GAMMA) if value >= 1 else _ZERO
        self.counts[key] = self.counts.get(key, 0) + 1
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value

    def merge(self, other: Sketch) -> None:
        for key, count in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + count
        self.low = min(self.low, other.low)
        self.high = max(self.high, other.high)

    def quantile(self, q: float) -> float:
        """The value at the nearest rank of `q` (NaN for an empty window, as prometheus-cpp's)."""
        total = sum(self.counts.values())
        if not total:
            return math.nan
        if q >= 1.0 or q <= 0.0:  # (the extremes are known exactly)
            return float(self.high if q >= 1.0 else self.low)
        rank, seen = max(1.0, math.ceil(q * total)), 0.0
        for key in sorted(self.counts):
            seen += self.counts[key]
            if seen >= rank:
                middle = 0.0 if key == _ZERO else 2 * _GAMMA**key / (_GAMMA + 1)
                return float(round(min(max(middle, self.low), self.high)))
        return float(self.high)


class Series:
    """One model version's observations (ModelStatistics.latency points here)."""

    __slots__ = ("owner", "buckets", "first_response", "counts", "sums", "windows")

    def __init__(self, owner: LatencyMetrics, buckets: tuple[float, ...] = FIRST_RESPONSE_BUCKETS_MS) -> None:
        self.owner = owner
        self.buckets = buckets  # the first-response histogram's: Triton's, or the config's model_metrics
        self.first_response = [0] * (len(buckets) + 1) + [0]  # per bucket..., sum
        self.counts = dict.fromkeys(STAGES, 0)
        self.sums = dict.fromkeys(self.counts, 0)
        self.windows: dict[int, dict[str, Sketch]] = {}  # window step -> stage -> its sketch

    def observe_first_response(self, duration_ns: int) -> None:
        if not self.owner.config.histogram_latencies:
            return
        ms = duration_ns // 1_000_000
        index = next((i for i, bound in enumerate(self.buckets) if ms <= bound), -2)
        self.first_response[index] += 1
        self.first_response[-1] += ms

    def observe_success(self, times_ns: tuple[int, int, int, int, int]) -> None:
        """A successful request's five times (request, queue, compute input, infer and output)."""
        if not self.owner.config.summary_latencies:
            return
        step = self.owner.step()
        sketches = self.windows.get(step)
        if sketches is None:
            sketches = self.windows[step] = {stage: Sketch() for stage in self.counts}
            for old in [s for s in self.windows if s <= step - self.owner.config.summary_age_buckets]:
                del self.windows[old]
        counts, sums, log, ceil = self.counts, self.sums, math.log, math.ceil
        # (Sketch.add inlined: ~2x cheaper here, where a request is observed five times)
        for stage, ns in zip(STAGES, times_ns):
            us = ns // 1000 if ns > 0 else 0
            counts[stage] += 1
            sums[stage] += us
            sketch = sketches[stage]
            key = ceil(log(us) * _INV_LN_GAMMA) if us >= 1 else _ZERO
            buckets = sketch.counts
            buckets[key] = buckets.get(key, 0) + 1
            if us < sketch.low:
                sketch.low = us
            if us > sketch.high:
                sketch.high = us

    def window(self, stage: str) -> Sketch:
        """The sketch of the last max_age seconds."""
        merged, oldest = Sketch(), self.owner.step() - self.owner.config.summary_age_buckets
        for step, sketches in self.windows.items():
            if step > oldest:
                merged.merge(sketches[stage])
        return merged


class LatencyMetrics:
    """The families above for the model versions `served()` names, as one collector of the registry."""

    def __init__(self, config: MetricsConfig, served: Any = None) -> None:
        self.config = config
        self.served = served  # () -> [(name, version)]: every served version has its series, zeros included
        self.buckets_of: Any = None  # (name, version) -> its config's first-response buckets (None: Triton's)
        self.series: dict[tuple[str, int], Series] = {}
        self.step_s = config.summary_max_age_s / config.summary_age_buckets

    def step(self) -> int:
        return int(time.time() / self.step_s)

    def of(self, name: str, version: int) -> Series:
        series = self.series.get((name, version))
        if series is None:
            buckets = self.buckets_of(name, version) if self.buckets_of is not None else None
            series = self.series[(name, version)] = Series(self, buckets or FIRST_RESPONSE_BUCKETS_MS)
        return series

    def collect(self) -> Iterable[Metric]:
        versions = list(self.served()) if self.served is not None else list(self.series)
        families = []
        if self.config.histogram_latencies:
            families.append(self._first_response(versions))
        if self.config.summary_latencies:
            families += self._summaries(versions)
        return families

    def _first_response(self, versions: list[tuple[str, int]]) -> Metric:
        family = Metric(FIRST_RESPONSE, "Duration from request to first response in milliseconds", "histogram")
        for name, version in versions:
            series = self.of(name, version)
            labels = {"model": name, "version": str(version)}
            cumulative = 0
            for bound, count in zip((*series.buckets, math.inf), series.first_response):
                cumulative += count
                family.add_sample(FIRST_RESPONSE + "_bucket", {**labels, "le": prometheus_value(bound)}, cumulative)
            family.add_sample(FIRST_RESPONSE + "_count", labels, cumulative)
            family.add_sample(FIRST_RESPONSE + "_sum", labels, series.first_response[-1])
        return family

    def _summaries(self, versions: list[tuple[str, int]]) -> list[Metric]:
        families = {stage: Metric(name, doc, "summary") for stage, name, doc in SUMMARIES}
        window = Metric(WINDOW, "A gateway's summary windows as sketches (merged into the quantiles)", "gauge")
        bounds = Metric(WINDOW_BOUNDS, "The summary windows' -smallest and largest values", "gauge")
        for name, version in versions:
            series = self.series.get((name, version)) or Series(self)
            labels = {"model": name, "version": str(version)}
            for stage, family in families.items():
                family.add_sample(family.name + "_count", labels, series.counts[stage])
                family.add_sample(family.name + "_sum", labels, series.sums[stage])
                sketch = series.window(stage)
                for key, count in sketch.counts.items():
                    window.add_sample(WINDOW, {**labels, "stage": stage, "bucket": str(key)}, count)
                if sketch.counts:
                    bounds.add_sample(WINDOW_BOUNDS, {**labels, "stage": stage, "bound": _MIN}, -sketch.low)
                    bounds.add_sample(WINDOW_BOUNDS, {**labels, "stage": stage, "bound": _MAX}, sketch.high)
        return [*families.values(), window, bounds]


def finish(families: list[Metric], latency: LatencyMetrics | None) -> list[Metric]:
    """The server's families (merged) with each summary's quantiles from the gateways' windows added up;
    the windows themselves left out."""
    by_name = {f.name: f for f in families}
    if latency is None or WINDOW not in by_name:
        return families
    sketches: dict[tuple[str, str, str], Sketch] = {}
    for sample in by_name[WINDOW].samples:
        labels = sample.labels
        sketch = sketches.setdefault((labels["stage"], labels["model"], labels["version"]), Sketch())
        sketch.counts[int(labels["bucket"])] = sample.value
    for sample in by_name[WINDOW_BOUNDS].samples if WINDOW_BOUNDS in by_name else ():
        labels = sample.labels
        sketch = sketches.setdefault((labels["stage"], labels["model"], labels["version"]), Sketch())
        if labels["bound"] == _MIN:
            sketch.low = -sample.value
        else:
            sketch.high = sample.value
    names = {name: stage for stage, name, _ in SUMMARIES}
    for family in families:
        stage = names.get(family.name)
        if stage is None:
            continue
        for sample in [s for s in family.samples if s.name == family.name + "_count"]:
            model, version = sample.labels["model"], sample.labels["version"]
            sketch = sketches.get((stage, model, version), Sketch())
            for q, _ in latency.config.summary_quantiles:
                family.add_sample(family.name, {**sample.labels, "quantile": prometheus_value(q)}, sketch.quantile(q))
    return [f for f in families if f.name not in (WINDOW, WINDOW_BOUNDS)]
