"""gateway/cluster/merge.py: several gateways' own numbers as one server's (real prometheus_client registries)."""
from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ringserve.common.messages import ModelState, ModelStateReport
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.observe.process_metrics import GPU_FAMILIES
from ringserve.gateway.cluster.answers import PeerStatus
from ringserve.gateway.cache.metrics import SERVER_WIDE_FAMILIES as CACHE_SERVER_WIDE
from ringserve.gateway.cluster.merge import (BROADCAST, SERVER_WIDE, Families, gateway_scope, merge_metrics,
                                     merge_statistics, merge_status, parse_metrics)
from ringserve.gateway.core.errors import BadRequest
from ringserve.gateway.observe.metrics import GatewaySnapshot, Metrics, QueueSample, WorkerSample
from ringserve.gateway.observe.latencies import WINDOW_BOUNDS
from ringserve.gateway.observe.stats import Statistics
from ringserve.gateway.observe.triton_gauges import SERVER_GAUGES

from tests.support.gateway_fakes import count_success

MLP = ModelConfig(name="mlp", max_batch_size=8, inputs=(TensorConfig("x", "FP32", (4,)),),
                  outputs=(TensorConfig("y", "FP32", (4,)),), dynamic_batching=None, version=1,
                  model_path="/m/mlp/1/model.onnx")


def snapshot(depth: int = 0, restarts: int = 2) -> GatewaySnapshot:
    """What the supervisor told every gateway (workers, restarts, memory) and this gateway's queue."""
    return GatewaySnapshot(queues=[QueueSample("mlp", 1, depth, False)],
                           workers=[WorkerSample(0, True, 123_000_000, {"crash": restarts}, [("mlp", 1, 4096)])],
                           budget_bytes={0: 0}, gateway_restarts=[("0", {"crash": 1}), ("1", {})])


def gateway(depth: int = 0) -> Metrics:
    metrics = Metrics()
    metrics.attach(lambda: snapshot(depth))
    return metrics


def peer_text(metrics: Metrics) -> str:
    """What a peer answers to /metrics?scope=gateway."""
    return generate_latest(Families(gateway_scope(metrics.registry.collect()))).decode()


def merged_text(own: Metrics, *peers: Metrics, down: tuple[int, ...] = ()) -> str:
    gateways = {0: True, **{k: True for k in range(1, len(peers) + 1)}, **{k: False for k in down}}
    families = merge_metrics(own.registry.collect(), [parse_metrics(peer_text(p)) for p in peers], gateways)
    return generate_latest(Families(families)).decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


def test_request_counters_add_up_over_the_gateways():
    a, b = gateway(), gateway()
    for _ in range(3):
        a.count_request("mlp", 1, 200)
    for _ in range(4):
        b.count_request("mlp", 1, 200)
    b.count_request("mlp", 1, 503)

    text = merged_text(a, b)

    assert value(text, "ringserve_requests_total", model="mlp", version="1", code="200") == 7
    assert value(text, "ringserve_requests_total", model="mlp", version="1", code="503") == 1  # a series only the peer has


def test_histograms_merge_into_what_one_registry_seeing_every_observation_shows():
    """Buckets, _sum and _count add: the merge equals one gateway that saw everything."""
    a, b, everything = gateway(), gateway(), gateway()
    observations = [(0.0004, 1), (0.003, 2), (0.2, 8), (7.0, 3), (0.003, 64)]
    for i, (seconds, rows) in enumerate(observations):
        for metrics in ((a if i % 2 else b), everything):
            metrics.queue_seconds.observe("mlp", 1, seconds)  # LatencyHistogram (hand-written)
            metrics.request_seconds.observe("enc", 1, seconds * 2)
            metrics.batch_size.labels("mlp", "1").observe(rows)  # prometheus_client's Histogram
            metrics.compute_seconds.labels("mlp", "1").observe(seconds)

    merged = samples(merged_text(a, b))

    expected = samples(generate_latest(everything.registry).decode())
    for name in ("ringserve_queue_seconds", "ringserve_request_seconds", "ringserve_batch_size",
                 "ringserve_compute_seconds"):
        ours = {k: v for k, v in merged.items() if k[0].startswith(name + "_")}
        theirs = {k: v for k, v in expected.items() if k[0].startswith(name + "_")}
        assert ours == pytest.approx(theirs) and ours, name


def test_queue_depth_gauges_add_and_server_wide_families_are_written_once():
    a, b = gateway(depth=3), gateway(depth=5)

    text = merged_text(a, b)

    assert value(text, "ringserve_queue_depth", model="mlp", version="1") == 8
    # The supervisor's numbers, the same in every gateway: once, not twice.
    assert value(text, "ringserve_worker_restarts_total", worker="0", reason="crash") == 2
    assert value(text, "ringserve_gateway_restarts_total", gateway="0", reason="crash") == 1
    assert value(text, "ringserve_worker_memory_bytes", worker="0") == 123_000_000
    assert value(text, "ringserve_model_memory_bytes", model="mlp", version="1", worker="0") == 4096
    assert value(text, "ringserve_worker_up", worker="0") == 1
    assert value(text, "ringserve_model_quarantined", model="mlp", version="1") == 0


def test_a_gateway_scope_answer_holds_no_server_wide_family():
    names = {family.name for family in parse_metrics(peer_text(gateway(depth=1)))}
    assert "ringserve_queue_depth" in names and "ringserve_requests" in names
    assert not names & SERVER_WIDE


def test_events_every_gateway_sees_count_once_at_the_highest():
    """A model load is reported to every gateway: summing would count it G times. A restarted
    gateway saw fewer: the highest count wins."""
    report = ModelStateReport(model="mlp", version=1, key="mlp", state="ready", load_s=0.5, peak_refs=2)
    a, b, restarted = gateway(), gateway(), gateway()
    for metrics in (a, b):
        metrics.model_loads.labels("mlp", "1", "eager").inc(2)
        metrics.model_load_seconds.labels("mlp", "1").observe(0.5)
        metrics.observe_model_state(ModelState(report=report, cause="peak"))
    restarted.model_loads.labels("mlp", "1", "eager").inc(1)

    text = merged_text(a, b, restarted)

    assert value(text, "ringserve_model_loads_total", model="mlp", version="1", policy="eager") == 2
    assert value(text, "ringserve_model_load_seconds_count", model="mlp", version="1") == 1
    assert value(text, "ringserve_model_peak_references", model="mlp", version="1") == 2


def test_gateways_up_counts_those_whose_numbers_are_in():
    a, b = gateway(), gateway()

    text = merged_text(a, b, down=(2,))

    assert value(text, "ringserve_gateways_up") == 2
    assert [value(text, "ringserve_gateway_up", gateway=k) for k in "012"] == [1, 1, 0]


def test_one_gateway_alone_reads_as_its_own_registry_plus_gateways_up():
    a = gateway(depth=4)
    a.count_request("mlp", 1, 200)

    text = merged_text(a)

    alone = samples(generate_latest(a.registry).decode())
    assert {k: v for k, v in samples(text).items() if k[0] not in ("ringserve_gateways_up", "ringserve_gateway_up")} == alone
    assert value(text, "ringserve_gateways_up") == 1


def test_every_family_the_merge_names_exists_in_the_gateways_registry():
    """A renamed metric must not silently fall back to summing (or drop out of the server-wide set)."""
    names = {family.name for family in gateway().registry.collect()}
    # (the GPU families appear only where NVML finds a GPU: tests/unit/test_ops_metrics.py; Triton's host and load
    # gauges and the summaries' windows are registered beside Metrics: tests/unit/test_triton_families.py; the
    # response cache's only with a cache: tests/integration/test_response_cache.py)
    assert SERVER_WIDE - GPU_FAMILIES - SERVER_GAUGES - CACHE_SERVER_WIDE <= names and BROADCAST - {WINDOW_BOUNDS} <= names


def test_a_peer_family_of_another_type_is_left_out_and_garbage_is_refused():
    a = gateway()
    a.count_request("mlp", 1, 200)
    wrong = "# TYPE ringserve_requests gauge\nringserve_requests{model=\"mlp\",version=\"1\",code=\"200\"} 100\n"

    text = generate_latest(Families(merge_metrics(a.registry.collect(), [parse_metrics(wrong)], {0: True}))).decode()

    assert value(text, "ringserve_requests_total", model="mlp", version="1", code="200") == 1
    with pytest.raises(ValueError):
        parse_metrics("ringserve_requests_total{model=\"mlp\" 1\n")


# -- statistics ------------------------------------------------------------------------------------
def statistics(batches: list[tuple[int, float, int, int, float]], failures: int = 0) -> dict:
    """One gateway's `{"model_stats": [mlp]}` from executions of (size, compute_s, answered, rows, latency_s):
    `answered` requests of `rows` rows in all, `latency_s` between them, half of it queued."""
    stats = Statistics()
    mlp = stats.of("mlp", 1)
    for size, compute_s, answered, rows, latency_s in batches:
        Statistics.record_execution(mlp, size, 0, int(compute_s * 1e9), 0)
        each_ns = int(latency_s * 1e9) // answered
        for _ in range(answered):
            count_success(mlp, rows=rows // answered, latency_ns=each_ns, queue_ns=each_ns // 2,
                          infer_ns=int(compute_s * 1e9))
    for _ in range(failures):
        stats.record_failure("mlp", 1, 1000, BadRequest("bad"))
    return {"model_stats": [stats.model_stats(MLP)]}


def test_statistics_sum_every_count_and_duration_per_model_version():
    a = statistics([(4, 0.002, 2, 4, 0.01), (1, 0.001, 1, 1, 0.004)], failures=1)
    b = statistics([(4, 0.004, 4, 4, 0.02), (2, 0.003, 2, 2, 0.006)], failures=2)

    merged, unreadable = merge_statistics(a, {1: b})

    (m,) = merged["model_stats"]
    assert unreadable == {}

    assert (m["name"], m["version"]) == ("mlp", "1")
    assert m["inference_count"] == 11 and m["execution_count"] == 4
    stats = m["inference_stats"]
    assert stats["success"] == {"count": 9, "ns": 40_000_000}
    assert stats["fail"] == {"count": 3, "ns": 3000}
    assert stats["queue"] == {"count": 9, "ns": 20_000_000}
    assert stats["compute_infer"] == {"count": 9, "ns": 2 * 2_000_000 + 1_000_000 + 4 * 4_000_000 + 2 * 3_000_000}
    assert [(s["batch_size"], s["compute_infer"]) for s in m["batch_stats"]] == [
        (1, {"count": 1, "ns": 1_000_000}), (2, {"count": 1, "ns": 3_000_000}), (4, {"count": 2, "ns": 6_000_000})]
    assert m["last_inference"] == max(a["model_stats"][0]["last_inference"], b["model_stats"][0]["last_inference"])
    assert a["model_stats"][0]["inference_count"] == 5  # the inputs are left as they were


def test_statistics_of_a_model_only_a_peer_reports_are_left_out():
    a = statistics([(1, 0.001, 1, 1, 0.001)])
    other = {"model_stats": [{**statistics([(1, 0.001, 1, 1, 0.001)])["model_stats"][0], "name": "enc"}]}

    doc, _ = merge_statistics(a, {1: other})

    assert [m["name"] for m in doc["model_stats"]] == ["mlp"] and doc["model_stats"][0]["inference_count"] == 1


def test_a_statistics_document_that_cannot_be_merged_is_left_out_whole_and_named():
    a, b = statistics([(1, 0.001, 1, 1, 0.001)]), statistics([(2, 0.002, 2, 2, 0.002)])
    broken = statistics([(4, 0.004, 4, 4, 0.004)])
    broken["model_stats"][0]["inference_stats"]["fail"] = {"count": "many", "ns": 0}  # after counts it added

    doc, unreadable = merge_statistics(a, {1: broken, 2: b, 3: {"model_stats": 7}})

    assert doc["model_stats"][0]["inference_count"] == 3 and doc["model_stats"][0]["execution_count"] == 2
    assert sorted(unreadable) == [1, 3] and "cannot be merged" in unreadable[1]


# -- /admin/status ---------------------------------------------------------------------------------
def status(index: int, pid: int, depth: int, in_flight: int, free: int) -> dict:
    """A gateway's /admin/status?scope=gateway, shaped as gateway/http/server_routes.py writes it."""
    return {
        "ready": True, "draining": False,
        "gateway": {"index": index, "pid": pid, "draining": False, "queue_depth": depth, "requeued_batches": 0,
                    "in_flight_batches": in_flight, "in_flight_requests": 2 * in_flight,
                    "slots": {"total": 8, "free": free}},
        "gateways": [{"index": 0, "pid": 100, "generation": 1, "restarts": {}, "restarts_total": 0, "last_exit": None},
                     {"index": 1, "pid": 101, "generation": 2, "restarts": {"crash": 1}, "restarts_total": 1,
                      "last_exit": {"reason": "crash"}},
                     {"index": 2, "pid": 102, "generation": 1, "restarts": {}, "restarts_total": 0, "last_exit": None}],
        "workers": [{"index": 0, "pid": 50, "generation": 1, "state": "ready", "in_flight_batches": in_flight,
                     "in_flight_requests": 2 * in_flight, "batches_done": 10 * (index + 1)}],
        "models": {"mlp": {"queue_depth": depth, "requeued_batches": index, "ready": True}},
        "reload": {"replacing": [], "kept_models": {}},
        "slots": {"total": 8, "free": free},
    }


def test_status_sums_queues_in_flight_and_slots_and_lists_every_gateway():
    own, peer = status(0, 100, depth=3, in_flight=1, free=7), status(1, 201, depth=4, in_flight=2, free=6)

    doc = merge_status(own, {1: PeerStatus.read(peer), 2: "no answer within 0.5 s"}, count=3)

    assert doc["models"]["mlp"]["queue_depth"] == 7 and doc["models"]["mlp"]["requeued_batches"] == 1
    (worker,) = doc["workers"]
    assert (worker["in_flight_batches"], worker["in_flight_requests"], worker["batches_done"]) == (3, 6, 30)
    assert doc["slots"] == {"total": 16, "free": 13}
    assert doc["answered_by"] == 0 and doc["gateways_up"] == 2 and "gateway" not in doc
    g0, g1, g2 = doc["gateways"]
    assert (g0["state"], g0["pid"], g0["queue_depth"], g0["in_flight_batches"]) == ("up", 100, 3, 1)
    # The gateway's own pid wins over the supervisor's last Snapshot; its restarts stay.
    assert (g1["state"], g1["pid"], g1["queue_depth"], g1["restarts_total"], g1["generation"]) == ("up", 201, 4, 1, 2)
    assert (g2["state"], g2["error"], g2["pid"], g2["queue_depth"]) == ("unreachable", "no answer within 0.5 s", 102, None)
    assert own["models"]["mlp"]["queue_depth"] == 3 and "gateway" in own  # the inputs are left as they were


def test_a_status_that_cannot_be_merged_is_left_out_whole_and_the_gateway_named():
    own = status(0, 100, depth=3, in_flight=1, free=7)
    broken = status(1, 201, depth=4, in_flight=2, free=6)
    del broken["slots"]  # read after its queues and workers
    unnamed = status(2, 202, depth=5, in_flight=5, free=0)
    del unnamed["gateway"]

    doc = merge_status(own, {1: PeerStatus.read(broken), 2: PeerStatus.read(unnamed)}, count=3)

    assert doc["models"]["mlp"]["queue_depth"] == 3 and doc["workers"][0]["in_flight_batches"] == 1
    assert doc["slots"] == {"total": 8, "free": 7} and doc["gateways_up"] == 1
    assert [g["state"] for g in doc["gateways"]] == ["up", "unreachable", "unreachable"]
    assert "cannot be merged" in doc["gateways"][1]["error"] and "KeyError" in doc["gateways"][2]["error"]


def test_a_peer_status_is_decoded_once_into_its_dataclass_and_a_bad_count_named():
    peer = status(1, 201, depth=4, in_flight=2, free=6)

    decoded = PeerStatus.read(peer)

    assert isinstance(decoded, PeerStatus) and decoded.models["mlp"].queue_depth == 4
    assert (decoded.workers[0].worker_index, decoded.slots_free, decoded.gateway["pid"]) == (0, 6, 201)
    peer["models"]["mlp"]["queue_depth"] = "4"
    assert "cannot be merged (ValueError: queue_depth is '4', not a count)" in PeerStatus.read(peer)
    assert PeerStatus.read("no answer within 0.5 s") == "no answer within 0.5 s"


def test_status_of_one_gateway_alone_lists_it_up():
    own = status(0, 100, depth=1, in_flight=0, free=8)
    own["gateways"] = []  # (before the supervisor's first Snapshot)

    doc = merge_status(own, {}, count=1)

    assert [(g["index"], g["state"], g["pid"]) for g in doc["gateways"]] == [(0, "up", 100)]
    assert doc["models"]["mlp"]["queue_depth"] == 1 and doc["slots"] == {"total": 8, "free": 8}


def test_ringserve_status_prints_one_line_per_gateway(capsys: pytest.CaptureFixture[str]):
    from ringserve.cli.status import _print_gateways

    doc = merge_status(status(0, 100, depth=3, in_flight=1, free=7),
                       {1: PeerStatus.read(status(1, 201, depth=4, in_flight=2, free=6)), 2: "no answer within 0.5 s"}, count=3)

    _print_gateways(doc)

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "answered by gateway 0; gateways up: 2/3"
    assert lines[2].split() == ["0", "100", "1", "up", "3", "2", "0", "-", "/", "-"]
    assert lines[3].split() == ["1", "201", "2", "up", "4", "4", "1", "crash=1", "/", "crash"]
    assert lines[4].split()[:6] == ["2", "102", "1", "unreachable", "-", "-"]
    assert lines[4].endswith("(no answer within 0.5 s)")
