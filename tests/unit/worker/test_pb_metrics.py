"""worker/python/pb_metrics.py: pb_utils.MetricFamily and Metric, with Triton's rules, and the file they are published in."""
from __future__ import annotations

import gc
import json
import struct
from pathlib import Path

import pytest

from ringserve.common import model_metrics
from ringserve.worker.python import pb_metrics, pb_utils


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> pb_metrics.Registry:
    registry = pb_metrics.Registry()
    monkeypatch.setattr(pb_metrics, "registry", registry)
    return registry


def family_of(registry: pb_metrics.Registry, name: str) -> dict:
    return next(f for f in registry.snapshot()["families"] if f["name"] == name)


def test_a_counter_increments_by_non_negative_values_and_refuses_set_and_observe(fresh_registry) -> None:
    family = pb_utils.MetricFamily(name="requests_process_latency_ns", description="Cumulative time",
                                   kind=pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"model": "m", "version": "1"})

    metric.increment(5)
    metric.increment(2.5)

    assert metric.value() == 7.5
    for refused in (lambda: metric.increment(-1), lambda: metric.set(1), lambda: metric.observe(1)):
        with pytest.raises(pb_utils.TritonModelException):
            refused()
    assert family_of(fresh_registry, "requests_process_latency_ns")["series"][0]["labels"] == {"model": "m",
                                                                                             "version": "1"}


def test_a_gauge_sets_and_increments_either_way() -> None:
    metric = pb_utils.MetricFamily("queue", "Queued", pb_utils.MetricFamily.GAUGE).Metric()

    metric.set(10)
    metric.increment(-3)

    assert metric.value() == 7


def test_a_histogram_needs_buckets_observes_and_has_no_one_value(fresh_registry) -> None:
    family = pb_utils.MetricFamily("latency", "Latency", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException, match="Missing required buckets"):
        family.Metric(labels={"a": "b"})
    metric = family.Metric(labels={"a": "b"}, buckets=[0.1, 1.0])

    for value in (0.05, 0.5, 0.7, 3.0):
        metric.observe(value)

    (series,) = family_of(fresh_registry, "latency")["series"]
    assert (series["counts"], series["count"], series["sum"]) == ([1, 2, 1], 4, pytest.approx(4.25))
    with pytest.raises(pb_utils.TritonModelException):
        metric.value()
    with pytest.raises(pb_utils.TritonModelException, match="Unexpected buckets"):
        pb_utils.MetricFamily("c", "C", pb_utils.MetricFamily.COUNTER).Metric(buckets=[1.0])


def test_a_name_is_one_family_and_the_same_labels_one_series_as_in_triton() -> None:
    first = pb_utils.MetricFamily("shared", "first description", pb_utils.MetricFamily.COUNTER)
    second = pb_utils.MetricFamily("shared", "second description", pb_utils.MetricFamily.COUNTER)
    a, b = first.Metric(labels={"k": "v"}), second.Metric(labels={"k": "v"})

    a.increment(1)
    b.increment(2)

    assert a.value() == b.value() == 3
    with pytest.raises(pb_utils.TritonModelException, match="one kind"):
        pb_utils.MetricFamily("shared", "x", pb_utils.MetricFamily.GAUGE)


def test_a_series_lives_while_a_metric_holds_it(fresh_registry) -> None:
    family = pb_utils.MetricFamily("owned", "Owned", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"k": "v"})
    metric.increment(1)

    del metric
    gc.collect()
    assert family_of(fresh_registry, "owned")["series"] == []
    del family
    gc.collect()
    assert fresh_registry.snapshot()["families"] == []


def test_the_registry_is_published_only_when_it_changed_and_leaves_with_the_worker(
        fresh_registry, tmp_path: Path) -> None:
    fresh_registry.publish_to(str(tmp_path), 3, 2)
    metric = pb_utils.MetricFamily("n", "N", pb_utils.MetricFamily.COUNTER).Metric()
    metric.increment(4)
    path = model_metrics.path_of(str(tmp_path), 3, 2)

    fresh_registry.publish()
    written = path.stat().st_mtime_ns
    fresh_registry.publish()  # (nothing changed: not written again)

    assert path.stat().st_mtime_ns == written
    assert model_metrics.read(path)["families"][0]["series"][0]["value"] == 4
    assert [index for index, _ in model_metrics.read_live(str(tmp_path))] == [3]
    fresh_registry.unpublish()
    assert not path.exists()


def test_a_dead_workers_file_is_not_read_and_its_successor_removes_it(fresh_registry, tmp_path: Path) -> None:
    dead = model_metrics.path_of(str(tmp_path), 0, 1)
    payload = json.dumps({"pid": 2**22 + 12345, "families": []}).encode()  # (above any pid_max: none runs)
    dead.write_bytes(struct.pack("<QQ", 2, len(payload)) + payload)  # (as a Publisher leaves it)

    assert model_metrics.read_live(str(tmp_path)) == []
    fresh_registry.publish_to(str(tmp_path), 0, 2)
    assert not dead.exists()
    fresh_registry.unpublish()
