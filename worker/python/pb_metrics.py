"""Triton's custom metrics for Python models: pb_utils.MetricFamily and its Metric, kept in the worker.

    family = pb_utils.MetricFamily(name="latency_ns", description="...", kind=pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"model": "m"})        # HISTOGRAM: Metric(labels, buckets=[...])
    metric.increment(1.0); metric.set(2.0); metric.observe(0.3); metric.value()

As in Triton (python_backend's metric_family.cc, the core's TRITONSERVER_Metric* calls): a family of the
same name is the same family (its first description stays; another kind is refused), a Metric of the
same labels is the same series, increment takes no negative value on a COUNTER, set is a GAUGE's,
observe a HISTOGRAM's, value() a COUNTER's or GAUGE's; a series lives while a Metric object holds it
(the model owns its metrics' lifetime: an unloaded model's go with its objects).

The worker keeps the values; after each call into model code that changed one (worker/python/python_model.py:
`running`), and once a second for a model's own threads, it writes its whole registry where the
gateways read it (common/model_metrics.py), and /metrics shows the families beside the server's.
`value()` is this worker's own; /metrics adds the workers' counters and histograms up.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import threading
import time
from typing import Any

from ringserve.common import model_metrics

from .pb_errors import TritonModelException

log = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 1.0  # changes made outside a call into model code (a model's threads) show within this
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class MetricKind(enum.IntEnum):
    """Triton's MetricKind numbers (kCounter 0, kGauge 1, kHistogram 2)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


def _refuse(message: str) -> Exception:
    return TritonModelException(message)


class _Series:
    def __init__(self, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.labels, self.buckets = labels, buckets
        self.value = 0.0
        self.counts = [0] * (len(buckets) + 1) if buckets is not None else []
        # updated: 0 until changed, so a gauge no worker has set never wins over one set (gateway merge)
        self.sum, self.count, self.updated, self.holders = 0.0, 0, 0.0, 0

    def snapshot(self) -> dict[str, Any]:
        if self.buckets is None:
            return {"labels": self.labels, "value": self.value, "updated": self.updated}
        return {
            "labels": self.labels,
            "buckets": self.buckets,
            "counts": self.counts,
            "sum": self.sum,
            "count": self.count,
            "updated": self.updated,
        }


class _Family:
    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.series: dict[str, _Series] = {}
        self.holders = 0


class Registry:
    """This worker's families, and where it publishes them (nowhere until `publish_to`)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # (an RLock: a Metric's __del__ may run inside a locked call)
        self.families: dict[str, _Family] = {}
        self.changed = False
        self.publisher: model_metrics.Publisher | None = None
        self._thread: threading.Thread | None = None

    def family(self, name: str, description: str, kind: MetricKind) -> _Family:
        with self.lock:
            family = self.families.get(name)
            if family is None:
                family = self.families[name] = _Family(name, description, kind)
                self._start_publisher()
            elif family.kind != kind:
                raise _refuse(f"MetricFamily {name!r} exists as a {family.kind.name}; a family's name has one kind")
            family.holders += 1
            return family

    def series(self, family: _Family, labels: dict[str, str], buckets: list[float] | None) -> _Series:
        key = json.dumps(labels, sort_keys=True)
        with self.lock:
            series = family.series.get(key)
            if series is None:
                series = family.series[key] = _Series(labels, buckets)
                self.changed = True
            series.holders += 1
            return series

    def release_series(self, family: _Family, series: _Series) -> None:
        with self.lock:
            series.holders -= 1
            if series.holders <= 0:
                family.series = {k: s for k, s in family.series.items() if s is not series}
                self._drop_if_unused(family)
                self.changed = True

    def release_family(self, family: _Family) -> None:
        with self.lock:
            family.holders -= 1
            self._drop_if_unused(family)
            self.changed = True

    def _drop_if_unused(self, family: _Family) -> None:
        if family.holders <= 0 and not family.series and self.families.get(family.name) is family:
            del self.families[family.name]

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "pid": os.getpid(),
                "families": [
                    {
                        "name": f.name,
                        "description": f.description,
                        "kind": f.kind.name.lower(),
                        "series": [s.snapshot() for s in f.series.values()],
                    }
                    for f in self.families.values()
                ],
            }

    def publish(self) -> None:
        """Write the registry where the gateways read it, if it changed since it was last written."""
        if not self.changed or self.publisher is None:
            return
        with self.lock:
            publisher = self.publisher
            if publisher is None:
                return
            self.changed = False
            try:
                publisher.write(self.snapshot())
            except OSError as exc:
                log.warning("custom metrics could not be written to %s: %s", publisher.path, exc)

    def publish_to(self, runtime_dir: str, index: int, generation: int) -> None:
        """From now on publish into this worker's file (and remove what a dead predecessor left)."""
        model_metrics.remove_dead(runtime_dir, index)
        publisher = model_metrics.Publisher(model_metrics.path_of(runtime_dir, index, generation))
        with self.lock:
            self.publisher, self.changed = publisher, True
            if self.families:
                self._start_publisher()

    def unpublish(self) -> None:
        """At the worker's exit: its numbers leave /metrics with it."""
        with self.lock:
            publisher, self.publisher = self.publisher, None
        if publisher is not None:
            publisher.close()

    def _start_publisher(self) -> None:
        if self._thread is None and self.publisher is not None:
            self._thread = threading.Thread(target=self._publish_often, name="model-metrics", daemon=True)
            self._thread.start()

    def _publish_often(self) -> None:
        while self.publisher is not None:
            time.sleep(PUBLISH_INTERVAL_S)
            self.publish()


registry = Registry()


class Metric:
    """One series of a family (its labels); made by MetricFamily.Metric(labels, buckets)."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None) -> None:
        self._family = family  # (held: Triton's family outlives its metrics)
        self._series = registry.series(family._family, labels, buckets)

    def increment(self, value: float) -> None:
        kind = self._family._family.kind
        if kind == MetricKind.HISTOGRAM:
            raise _refuse("Metric.increment: a HISTOGRAM is changed by observe(value)")
        if kind == MetricKind.COUNTER and value < 0:
            raise _refuse("Metric.increment: a COUNTER can only be incremented monotonically by non-negative values")
        self._change(lambda s: setattr(s, "value", s.value + float(value)))

    def set(self, value: float) -> None:
        if self._family._family.kind != MetricKind.GAUGE:
            raise _refuse(f"Metric.set: only a GAUGE is set, this is a {self._family._family.kind.name}")
        self._change(lambda s: setattr(s, "value", float(value)))

    def observe(self, value: float) -> None:
        if self._family._family.kind != MetricKind.HISTOGRAM:
            raise _refuse(f"Metric.observe: only a HISTOGRAM observes, this is a {self._family._family.kind.name}")
        self._change(lambda s: _observe(s, float(value)))

    def value(self) -> float:
        if self._family._family.kind == MetricKind.HISTOGRAM:
            raise _refuse("Metric.value: a HISTOGRAM has no one value")
        with registry.lock:
            return self._series.value

    def _change(self, how: Any) -> None:
        with registry.lock:
            how(self._series)
            self._series.updated = time.time()
            registry.changed = True

    def __del__(self) -> None:
        try:
            registry.release_series(self._family._family, self._series)
        except Exception:  # noqa: BLE001, S110 - at the interpreter's exit the registry may be gone
            pass


def _observe(series: _Series, value: float) -> None:
    buckets = series.buckets or []
    index = next((i for i, bound in enumerate(buckets) if value <= bound), len(buckets))
    series.counts[index] += 1
    series.sum += value
    series.count += 1


class MetricFamily:
    """Triton's pb_utils.MetricFamily(name, description, kind)."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind | int) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _refuse(f"MetricFamily: {name!r} is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)")
        try:
            kind = MetricKind(kind)
        except ValueError:
            raise _refuse(f"MetricFamily: kind {kind!r} is none of COUNTER, GAUGE, HISTOGRAM") from None
        self._family = registry.family(name, str(description), kind)

    def Metric(self, labels: dict[str, Any] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802 - Triton's name
        if labels is not None and not isinstance(labels, dict):
            raise _refuse("Failed to create metric. Labels must be a dictionary.")
        labels = {str(k): str(v) for k, v in (labels or {}).items()}
        bad = [k for k in labels if not _LABEL.fullmatch(k) or k.startswith("__")]
        if bad:
            raise _refuse(f"Failed to create metric. {bad[0]!r} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        kind = self._family.kind
        if buckets is not None:
            if not isinstance(buckets, list):
                raise _refuse("Failed to create metric. Buckets must be a list.")
            if kind != MetricKind.HISTOGRAM:
                raise _refuse("Failed to create metric. Unexpected buckets found.")
            buckets = [float(b) for b in buckets]
            if buckets != sorted(set(buckets)):
                raise _refuse("Failed to create metric. Buckets must be in increasing order.")
        elif kind == MetricKind.HISTOGRAM:
            raise _refuse("Failed to create metric. Missing required buckets.")
        return Metric(self, labels, buckets)

    def __del__(self) -> None:
        try:
            registry.release_family(self._family)
        except Exception:  # noqa: BLE001, S110 - at the interpreter's exit the registry may be gone
            pass
