"""Triton's gauges of the host and of model loads, and the hook that registers every Triton family
that is not the statistics' own (gateway/cluster/triton_metrics.py has those):

    nv_cpu_utilization            the host's CPU busy fraction [0.0 - 1.0] since this gateway's previous
                                  scrape (at least MIN_WINDOW_S before; its first: since boot), from
                                  /proc/stat's aggregate line as Triton reads it: (user + nice + system +
                                  irq + softirq + steal) / (those + idle + iowait)
    nv_cpu_memory_total_bytes     /proc/meminfo's MemTotal
    nv_cpu_memory_used_bytes      MemTotal - MemAvailable (Triton's "used")
    nv_model_load_duration_secs{model,version}
                                  how long the version's load took, warm-up included: of the workers that
                                  hold it ready now, the slowest (Triton's is one load of every instance).
                                  A version no worker holds has none (Triton drops it at the unload).

Triton reads the first three every --metrics-interval-ms / 2; here they are read at scrape time. All four
are the server's (merge.py's SERVER_WIDE): written once, by the gateway that answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from ringserve.common.metrics_config import first_response_buckets

log = logging.getLogger(__name__)

CPU_UTILIZATION = "nv_cpu_utilization"
CPU_MEMORY_TOTAL = "nv_cpu_memory_total_bytes"
CPU_MEMORY_USED = "nv_cpu_memory_used_bytes"
LOAD_DURATION = "nv_model_load_duration_secs"
SERVER_GAUGES = frozenset({CPU_UTILIZATION, CPU_MEMORY_TOTAL, CPU_MEMORY_USED, LOAD_DURATION})
MIN_WINDOW_S = 0.2  # scrapes closer than this repeat the last value (a fraction of a few ticks says little)
_BUSY = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (of /proc/stat's cpu line)
_IDLE = (3, 4)  # idle iowait


def read_cpu_ticks(path: str = "/proc/stat") -> tuple[int, int]:
    """(busy, idle) ticks since boot, from the aggregate `cpu ` line."""
    with open(path) as f:
        line = f.readline()
    if not line.startswith("cpu "):
        raise ValueError(f"{path}: no aggregate cpu line first")
    ticks = [int(v) for v in line.split()[1:9]]
    ticks += [0] * (8 - len(ticks))
    return sum(ticks[i] for i in _BUSY), sum(ticks[i] for i in _IDLE)


def read_memory_bytes(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(total, used) bytes: MemTotal, and MemTotal - MemAvailable."""
    found: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                found[name] = int(rest.split()[0]) * 1024  # (kB)
    total, available = found["MemTotal"], found["MemAvailable"]
    return total, max(total - available, 0)


class HostCollector:
    """nv_cpu_*: read at each scrape; a read that fails writes 0, as Triton's poll does."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.last: tuple[float, int, int] = (0.0, 0, 0)  # (monotonic, busy, idle) of the last window's end
        self.utilization = 0.0

    def collect(self) -> Iterable[Metric]:
        utilization = GaugeMetricFamily(CPU_UTILIZATION, "CPU utilization rate [0.0 - 1.0]")
        total = GaugeMetricFamily(CPU_MEMORY_TOTAL, "CPU total memory (RAM), in bytes")
        used = GaugeMetricFamily(CPU_MEMORY_USED, "CPU used memory (RAM), in bytes")
        try:
            utilization.add_metric([], self._utilization())
        except (OSError, ValueError) as exc:
            log.debug("no CPU utilization: %s", exc)
            utilization.add_metric([], 0.0)
        try:
            total_bytes, used_bytes = read_memory_bytes(f"{self.proc}/meminfo")
        except (OSError, ValueError, KeyError, IndexError) as exc:
            log.debug("no memory numbers: %s", exc)
            total_bytes = used_bytes = 0
        total.add_metric([], float(total_bytes))
        used.add_metric([], float(used_bytes))
        return [utilization, total, used]

    def _utilization(self) -> float:
        now = time.monotonic()
        if self.last[0] and now - self.last[0] < MIN_WINDOW_S:
            return self.utilization
        busy, idle = read_cpu_ticks(f"{self.proc}/stat")
        busy_ticks, idle_ticks = max(busy - self.last[1], 0), max(idle - self.last[2], 0)
        if busy_ticks + idle_ticks:
            # 4 places: written as digits (Triton's QA reads `nv_cpu_utilization (\d+\.?\d*)`, no exponent)
            self.utilization = round(busy_ticks / (busy_ticks + idle_ticks), 4)
        self.last = (now, busy, idle)
        return self.utilization


class LoadDurations:
    """nv_model_load_duration_secs from the workers' model reports (gateway/dispatch/fleet.py)."""

    def __init__(self, workers: Callable[[], Iterable[Any]]) -> None:
        self.workers = workers  # () -> the WorkerHandles of the serving generations

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(LOAD_DURATION, "Model load time in seconds", labels=["model", "version"])
        slowest: dict[tuple[str, int], float] = {}
        for worker in self.workers():
            if worker.state != "ready":
                continue
            for found in worker.model_states.values():
                if found.state == "ready":
                    key = (found.model, found.version)
                    slowest[key] = max(slowest.get(key, 0.0), found.load_s)
        for (model, version), seconds in sorted(slowest.items()):
            family.add_metric([model, str(version)], seconds)
        return [family]


def register_triton_families(registry: CollectorRegistry, statistics: Any, dispatcher: Any) -> None:
    """The host's and the loads' gauges, and --metrics-config's latency families (for every served version)."""
    registry.register(HostCollector())
    registry.register(LoadDurations(lambda: dispatcher.workers.values()))
    if statistics.latency is not None:
        catalog = dispatcher.catalog
        statistics.latency.served = lambda: [
            (config.name, config.version)
            for name in sorted(catalog.configs)
            for config in catalog.served_versions(name)
        ]
        statistics.latency.buckets_of = lambda name, version: next(
            (
                first_response_buckets(config.extra.get("model_metrics"))
                for config in catalog.served_versions(name)
                if config.version == version
            ),
            None,
        )
        registry.register(statistics.latency)
