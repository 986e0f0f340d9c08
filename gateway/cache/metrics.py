"""Triton's `nv_cache_*` families in /metrics.

Per model version whose config enables the cache (Triton makes them only for those: core
src/metric_model_reporter.cc), labelled `model` and `version`, counted by each gateway and added up
over the gateways as the other per-model counters are (gateway/cluster/merge.py); the names and meanings of
Triton's core src/metrics.cc:

    nv_cache_num_hits_per_model        cache hits                                  = statistics' cache_hit.count
    nv_cache_num_misses_per_model      cache misses (of successful requests)       = cache_miss.count
    nv_cache_hit_duration_per_model    lookup time of the hits, in microseconds    = cache_hit.ns / 1000
    nv_cache_miss_duration_per_model   lookup and insertion time of the misses, µs = cache_miss.ns / 1000

And the cache's own, server-wide, read from the store every gateway shares (shm/cache.py), so written once,
from the gateway that answers: the names Triton's core gave them while the local cache was inside it
(src/metrics.cc before the TRITONCACHE API), gauges as they were there:

    nv_cache_num_entries       responses stored now
    nv_cache_num_lookups       lookups (hits and misses)
    nv_cache_num_hits          hits
    nv_cache_num_misses        misses
    nv_cache_num_evictions     responses evicted to make room
    nv_cache_lookup_duration   lookup time, hits and misses, in microseconds
    nv_cache_insertion_duration  insertion time, in microseconds
    nv_cache_util              the arena's bytes in use / its size, 0.0 to 1.0

ringserve's own, of the raw-request index beside Triton's key (gateway/cache/raw.py): its answers are not
counted in nv_cache_num_entries, and its hits are counted in nv_cache_num_hits too.

    ringserve_cache_raw_entries  HTTP answers stored under their raw request's key
    ringserve_cache_raw_hits     hits of those (a subset of nv_cache_num_hits)
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ringserve.gateway.cache.responses import ResponseCache
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.observe.stats import ModelStatistics

LABELS = ["model", "version"]
PER_MODEL = {
    "nv_cache_num_hits_per_model": ("Number of cache hits per model", lambda s: s.cache_hit_count),
    "nv_cache_num_misses_per_model": ("Number of cache misses per model", lambda s: s.cache_miss_count),
    "nv_cache_hit_duration_per_model": (
        "Total cache hit duration per model, in microseconds",
        lambda s: s.cache_hit_ns // 1000,
    ),
    "nv_cache_miss_duration_per_model": (
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        lambda s: s.cache_miss_ns // 1000,
    ),
}
# name -> (help, the store's number it reads)
SERVER_WIDE = {
    "nv_cache_num_entries": ("Number of responses stored in response cache", "entries"),
    "nv_cache_num_lookups": ("Number of cache lookups in response cache", "lookups"),
    "nv_cache_num_hits": ("Number of cache hits in response cache", "hits"),
    "nv_cache_num_misses": ("Number of cache misses in response cache", "misses"),
    "nv_cache_num_evictions": ("Number of cache evictions in response cache", "evictions"),
    "nv_cache_lookup_duration": ("Total cache lookup duration (hit and miss), in microseconds", "lookup_ns"),
    "nv_cache_insertion_duration": ("Total cache insertion duration, in microseconds", "insertion_ns"),
}
RAW = {
    "ringserve_cache_raw_entries": (
        "HTTP answers stored under their raw request's key (not in nv_cache_num_entries)",
        "raw_entries",
    ),
    "ringserve_cache_raw_hits": ("Cache hits on a raw request's key (counted in nv_cache_num_hits too)", "raw_hits"),
}
UTIL = "nv_cache_util"
SERVER_WIDE_FAMILIES = frozenset({*SERVER_WIDE, *RAW, UTIL})  # one store's numbers: not summed over gateways
CACHE_FAMILIES = frozenset({*PER_MODEL, *SERVER_WIDE, UTIL})  # written as Triton writes them


class CacheMetrics:
    """A collector of the nv_cache_* families (registered by the gateway's composition root when the server
    has a cache)."""

    def __init__(self, cache: ResponseCache, catalog: Catalog) -> None:
        self.cache = cache
        self.catalog = catalog

    def collect(self) -> Iterable[Metric]:
        families = {name: CounterMetricFamily(name, doc, labels=LABELS) for name, (doc, _) in PER_MODEL.items()}
        statistics, empty = self.cache.statistics, ModelStatistics()
        for name in sorted(self.catalog.configs):
            for config in self.catalog.served_versions(name):
                if not self.cache.enabled(config):
                    continue
                stats = statistics.models.get((config.name, config.version), empty)
                for family, (_, read) in zip(families.values(), PER_MODEL.values()):
                    family.add_metric([config.name, str(config.version)], read(stats))
        numbers = self.cache.store.numbers()
        gauges = []
        for name, (doc, field) in (SERVER_WIDE | RAW).items():
            gauge = GaugeMetricFamily(name, doc)
            value = numbers[field]
            gauge.add_metric([], value // 1000 if field.endswith("_ns") else value)
            gauges.append(gauge)
        util = GaugeMetricFamily(UTIL, "Cache utilization [0.0 - 1.0]")
        util.add_metric([], numbers["used_bytes"] / numbers["capacity_bytes"])
        return [*families.values(), *gauges, util]
