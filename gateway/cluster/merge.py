"""One server's numbers from every gateway's own: /metrics, /admin/status and the statistics extension.

Each gateway counts what passed through it (its requests, batches, latencies, queues, its ring).
With G gateways, the one a client reached asks the others for their own share
(`?scope=gateway`, gateway/cluster/peers.py) and merges here:

- /metrics: the families of the gateway's own registry fall in three kinds.
  - Per-gateway traffic (every family not named below: requests, batches, latencies, queue
    depths, pruned and requeued requests, ...): each gateway counts its own share; summed per
    (sample name, labels), so counters, gauges and histograms (buckets, _sum, _count) add up.
  - BROADCAST: events every gateway sees once each (a worker's model state change goes to every
    gateway; each gateway judges a replacement worker's Ready itself): the same count in each,
    so taking them per sample at their highest (the longest-lived gateway has seen the most)
    instead of summing, which would multiply them by G.
  - SERVER_WIDE: what the supervisor's Snapshot and the worker reports give (restarts, worker
    memory, model memory, quarantine, the warm spares), the build info and the GPUs: not in a gateway's own scope
    at all, and written once, from the answering gateway.
  - PER_PROCESS: prometheus_client's `process_*` families, one series per process (`role`,
    `index`: gateway/observe/process_metrics.py). A gateway's own scope holds only its own process (`role`
    "gateway"); the supervisor's and the workers' are the answering gateway's. Never summed: a
    series already written is kept, so each process is counted once however many gateways answer.
  Plus `ringserve_gateways_up` (gateways whose numbers are in this answer) and
  `ringserve_gateway_up{gateway}` (1 per gateway whose numbers are in it, 0 for one that did not answer).
- statistics: per (model, version), every count and ns summed, last_inference the latest.
- /admin/status: queue depths, requeued batches, in-flight and done batches per worker, and the
  slots of the rings summed; `gateways` lists every index with the supervisor's numbers and the
  gateway's own (pid, queue depth, in-flight), or `unreachable` and why.

Peers' texts are parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from ringserve.gateway.cache.metrics import SERVER_WIDE_FAMILIES as CACHE_SERVER_WIDE
from ringserve.gateway.cluster.answers import UNREADABLE, PeerStatus, cannot_merge
from ringserve.gateway.observe.latencies import WINDOW_BOUNDS
from ringserve.gateway.observe.process_metrics import BUILD_INFO, GPU_FAMILIES, PROCESS_FAMILIES, ROLE_GATEWAY
from ringserve.gateway.observe.triton_gauges import SERVER_GAUGES

SERVER_WIDE = frozenset(
    {
        "ringserve_worker_up",
        "ringserve_worker_restarts",
        "ringserve_gateway_restarts",
        "ringserve_worker_memory_bytes",
        "ringserve_worker_unique_memory_bytes",
        "ringserve_lane_info",
        "ringserve_model_quarantined",
        "ringserve_model_memory_bytes",
        "ringserve_model_memory_budget_bytes",
        "ringserve_spare_takeovers",
        "ringserve_spare_deaths",
        "ringserve_spare_memory_bytes",
        BUILD_INFO,
        *GPU_FAMILIES,
        *SERVER_GAUGES,  # nv_cpu_*, nv_model_load_duration_secs
        *CACHE_SERVER_WIDE,  # read from the store every gateway shares (gateway/cache/metrics.py)
    }
)
PER_PROCESS = PROCESS_FAMILIES
BROADCAST = frozenset(
    {
        "ringserve_model_loads",
        "ringserve_model_unloads",
        "ringserve_model_load_seconds",
        "ringserve_model_budget_exhausted",
        "ringserve_model_peak_references",
        "ringserve_reload_failures",
        # read from a sequence model's state store, which every gateway shares (shm/states.py)
        "ringserve_sequences_active",
        "ringserve_sequence_state_bytes",
        WINDOW_BOUNDS,  # (not an event: the summary windows' extremes, at their highest: gateway/observe/latencies.py)
    }
)
GATEWAYS_UP = "ringserve_gateways_up"
GATEWAY_UP = "ringserve_gateway_up"
UNREACHABLE = "unreachable"


class Families:
    """Metric families as a collector: `generate_latest(Families(...))` writes them."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def gateway_scope(families: Iterable[Metric]) -> list[Metric]:
    """A gateway's own share: its families less the server-wide ones, and of the process families
    its own process's series only."""
    share = []
    for family in families:
        if family.name in PER_PROCESS:
            family = _own_process(family)
        if family.name not in SERVER_WIDE:
            share.append(family)
    return share


def _own_process(family: Metric) -> Metric:
    own = Metric(family.name, family.documentation, family.type, family.unit)
    own.samples = [s for s in family.samples if s.labels.get("role") == ROLE_GATEWAY]
    return own


def parse_metrics(text: str) -> list[Metric]:
    """A peer's exposition text as metric families (ValueError when it is not one)."""
    try:
        return list(text_string_to_metric_families(text))
    except Exception as exc:  # noqa: BLE001 - the parser raises ValueError, and IndexError/KeyError on some garbage
        raise ValueError(f"unparseable metrics text: {exc}") from None


def merge_metrics(own: Iterable[Metric], peers: Sequence[Iterable[Metric]], gateways: dict[int, bool]) -> list[Metric]:
    """The server's families: `own` (the whole registry of the answering gateway) and each peer's
    gateway scope; `gateways` says, per index, whether its numbers are in (self included)."""
    merged: dict[str, Metric] = {}
    # family -> (sample name, labels) -> [labels as first written, value]: the answering gateway's
    # label order is kept, so its own text and the merged one read alike.
    values: dict[str, dict[tuple, list]] = {}
    for family in own:
        merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
        series = values[family.name] = {}
        for sample in family.samples:
            series[(sample.name, _labels(sample.labels))] = [sample.labels, sample.value]
    for families in peers:
        for family in families:
            if family.name in SERVER_WIDE:
                continue  # (the answering gateway's, once)
            mine = merged.get(family.name)
            if mine is None:  # a family only a peer has (it was just added to its registry)
                mine = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            elif mine.type != family.type:
                continue
            series = values[family.name]
            combine = max if family.name in BROADCAST else _add
            per_process = family.name in PER_PROCESS
            for sample in family.samples:
                if per_process and sample.labels.get("role") != ROLE_GATEWAY:
                    continue  # (a peer's view of the supervisor and workers: the answering gateway's is in)
                key = (sample.name, _labels(sample.labels))
                entry = series.get(key)
                if entry is None:
                    series[key] = [sample.labels, sample.value]
                elif not per_process:  # (a process's series is written once: never summed)
                    entry[1] = combine(entry[1], sample.value)
    for name, family in merged.items():
        for (sample_name, _), (labels, value) in values[name].items():
            family.add_sample(sample_name, labels, value)
    up = Metric(GATEWAYS_UP, "Gateways whose numbers this answer holds (the answering one included)", "gauge")
    up.add_sample(GATEWAYS_UP, {}, float(sum(gateways.values())))
    each = Metric(GATEWAY_UP, "1 when this gateway's numbers are in this answer, 0 when it did not answer", "gauge")
    for index, answered in sorted(gateways.items()):
        each.add_sample(GATEWAY_UP, {"gateway": str(index)}, 1.0 if answered else 0.0)
    return [*merged.values(), up, each]


def _labels(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _add(a: float, b: float) -> float:
    return a + b


# -- the statistics extension ---------------------------------------------------------------------
def merge_statistics(own: dict[str, Any], peers: dict[int, dict[str, Any]]) -> tuple[dict[str, Any], dict[int, str]]:
    """{"model_stats": [...]} of the answering gateway with each peer's (by gateway index) added in, per
    (name, version), and the peers whose document could not be read, with why (left out whole).
    A model a peer reports and this gateway does not is left out: this gateway decides what was asked."""
    by_key = {(m["name"], m["version"]): _copy_stats(m) for m in own["model_stats"]}
    unreadable: dict[int, str] = {}
    for index, doc in sorted(peers.items()):
        before = copy.deepcopy(by_key)
        try:
            for theirs in doc["model_stats"]:
                mine = by_key.get((theirs.get("name"), theirs.get("version")))
                if mine is not None:
                    _add_stats(mine, theirs)
        except UNREADABLE as exc:
            by_key = before
            unreadable[index] = cannot_merge(exc)
    return {**own, "model_stats": list(by_key.values())}, unreadable


def _copy_stats(m: dict[str, Any]) -> dict[str, Any]:
    return {
        **m,
        "inference_stats": {k: dict(d) for k, d in m["inference_stats"].items()},
        "batch_stats": [{k: (dict(v) if isinstance(v, dict) else v) for k, v in b.items()} for b in m["batch_stats"]],
    }


def _add_stats(mine: dict[str, Any], theirs: dict[str, Any]) -> None:
    mine["inference_count"] += theirs.get("inference_count", 0)
    mine["execution_count"] += theirs.get("execution_count", 0)
    mine["last_inference"] = max(mine["last_inference"], theirs.get("last_inference", 0))
    for name, duration in theirs.get("inference_stats", {}).items():
        _add_duration(mine["inference_stats"].setdefault(name, {"count": 0, "ns": 0}), duration)
    batches = {b["batch_size"]: b for b in mine["batch_stats"]}
    for batch in theirs.get("batch_stats", []):
        entry = batches.get(batch["batch_size"])
        if entry is None:
            entry = batches[batch["batch_size"]] = {"batch_size": batch["batch_size"]}
        for name, duration in batch.items():
            if name != "batch_size":
                _add_duration(entry.setdefault(name, {"count": 0, "ns": 0}), duration)
    mine["batch_stats"] = [batches[size] for size in sorted(batches)]


def _add_duration(mine: dict[str, int], theirs: dict[str, int]) -> None:
    mine["count"] += theirs.get("count", 0)
    mine["ns"] += theirs.get("ns", 0)


# -- /admin/status ---------------------------------------------------------------------------------
def merge_status(own: dict[str, Any], peers: dict[int, PeerStatus | str], count: int) -> dict[str, Any]:
    """The answering gateway's gateway-scope status (with its `gateway` entry) and each peer's, or why
    that peer has none (a str), as one server's status.

    Summed: each model's queue_depth and requeued_batches (its poison_requests joined), each worker's
    (index and generation) in-flight and done batches, the slots. Taken from the answering gateway: readiness, draining,
    worker states, model states, reload (what the supervisor and the workers told every gateway).
    """
    doc = {
        **own,
        "models": {name: dict(m) for name, m in own["models"].items()},
        "workers": [dict(w) for w in own["workers"]],
        "slots": dict(own["slots"]),
    }
    live: dict[int, dict[str, Any] | str] = {}
    self_entry = doc.pop("gateway")
    live[self_entry["index"]] = self_entry
    models, workers = doc["models"], {(w["index"], w["generation"]): w for w in doc["workers"]}
    for index, theirs in sorted(peers.items()):
        if isinstance(theirs, str):
            live[index] = theirs
            continue
        _add_status(models, workers, doc["slots"], theirs)
        live[index] = dict(theirs.gateway)
    doc["gateways"] = _gateway_entries(own.get("gateways", []), live, count)
    doc["answered_by"] = self_entry["index"]
    doc["gateways_up"] = sum(1 for g in doc["gateways"] if g["state"] == "up")
    return doc


def _add_status(models: dict[str, dict], workers: dict[tuple, dict], slots: dict[str, int], theirs: PeerStatus) -> None:
    for name, model in theirs.models.items():
        mine = models.get(name)
        if mine is not None:
            mine["queue_depth"] += model.queue_depth
            mine["requeued_batches"] += model.requeued_batches
            if model.poison_requests:  # every gateway's, oldest first
                mine["poison_requests"] = sorted(
                    [*mine.get("poison_requests", ()), *model.poison_requests], key=lambda p: p["time"]
                )
    for worker in theirs.workers:
        mine = workers.get((worker.worker_index, worker.generation))
        if mine is not None:
            mine["in_flight_batches"] += worker.in_flight_batches
            mine["in_flight_requests"] += worker.in_flight_requests
            mine["batches_done"] += worker.batches_done
            mine["busy_s"] = mine.get("busy_s", 0.0) + worker.busy_s
    slots["total"] += theirs.slots_total
    slots["free"] += theirs.slots_free


def _gateway_entries(
    supervised: list[dict[str, Any]], live: dict[int, dict[str, Any] | str], count: int
) -> list[dict[str, Any]]:
    """One entry per gateway index: the supervisor's numbers (restarts, generation) under the gateway's own."""
    by_index = {g["index"]: g for g in supervised}
    entries = []
    for index in sorted(set(range(count)) | set(by_index) | set(live)):
        # One shape for every entry: the supervisor's fields are there (empty) before its first snapshot names it.
        entry = {
            "index": index,
            "pid": None,
            "generation": None,
            "restarts": {},
            "restarts_total": 0,
            "last_exit": None,
            **by_index.get(index, {}),
        }
        theirs = live.get(index, "did not answer")
        if isinstance(theirs, str):
            entry.update(
                state=UNREACHABLE, error=theirs, queue_depth=None, in_flight_batches=None, in_flight_requests=None
            )
        else:
            entry.update({k: v for k, v in theirs.items() if k != "index"}, state="up")
        entries.append(entry)
    return entries
