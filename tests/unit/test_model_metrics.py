"""gateway/observe/model_metrics.py: the workers' custom metrics, one family per name in /metrics, as Triton writes them."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ringserve.common import model_metrics
from ringserve.gateway.observe.model_metrics import exposition


def counter(name: str, value: float, **labels: str) -> dict:
    return {"name": name, "description": f"{name} help", "kind": "counter",
            "series": [{"labels": labels, "value": value, "updated": 1.0}]}


@pytest.fixture
def publish():
    """publish(runtime dir, worker index, *families): that worker's file, as pb_metrics writes it."""
    publishers: list[model_metrics.Publisher] = []

    def write(runtime_dir: Path, index: int, *families: dict) -> None:
        publishers.append(model_metrics.Publisher(model_metrics.path_of(str(runtime_dir), index, 1)))
        publishers[-1].write({"pid": os.getpid(), "families": list(families)})

    yield write
    for publisher in publishers:
        publisher.close()


def test_counters_and_histograms_add_up_over_workers_and_a_gauge_is_its_latest_value(tmp_path: Path, publish) -> None:
    histogram = {"name": "latency", "description": "Latency", "kind": "histogram", "series": [
        {"labels": {"model": "m"}, "buckets": [0.5, 1.0], "counts": [1, 0, 2], "sum": 4.2, "count": 3, "updated": 1.0}]}
    publish(tmp_path, 0, counter("done", 3, model="m"), histogram,
            {"name": "depth", "description": "Depth", "kind": "gauge",
             "series": [{"labels": {}, "value": 5, "updated": 20.0}]})
    publish(tmp_path, 1, counter("done", 4, model="m"), counter("done", 1, model="other"), histogram,
            {"name": "depth", "description": "Depth", "kind": "gauge",
             "series": [{"labels": {}, "value": 9, "updated": 10.0}]})

    text = exposition(str(tmp_path), reserved=()).decode()

    assert "# HELP done done help\n# TYPE done counter\n" in text
    assert 'done{model="m"} 7\n' in text and 'done{model="other"} 1\n' in text  # (no _total: Triton's name)
    assert "depth 5\n" in text
    assert 'latency_bucket{model="m",le="0.5"} 2\nlatency_bucket{model="m",le="1"} 2\n' in text
    assert 'latency_bucket{model="m",le="+Inf"} 6\nlatency_sum{model="m"} 8.4\nlatency_count{model="m"} 6\n' in text
    assert {f.name for f in text_string_to_metric_families(text)} == {"done", "depth", "latency"}


def test_a_name_of_the_servers_own_or_of_another_kind_is_left_out(tmp_path: Path, publish) -> None:
    publish(tmp_path, 0, counter("nv_inference_count", 1), counter("mine", 1))
    publish(tmp_path, 1, {"name": "mine", "description": "", "kind": "gauge",
                          "series": [{"labels": {}, "value": 100, "updated": 99.0}]})

    text = exposition(str(tmp_path), reserved=["nv_inference_count"]).decode()

    assert "nv_inference_count" not in text and "mine 1\n" in text and "gauge" not in text


def test_no_model_metrics_write_nothing(tmp_path: Path) -> None:
    assert exposition(str(tmp_path), reserved=()) == b""
    assert exposition(str(tmp_path / "gone"), reserved=()) == b""


def test_a_file_read_while_its_worker_rewrites_it_is_the_last_whole_snapshot(tmp_path: Path) -> None:
    path = model_metrics.path_of(str(tmp_path), 0, 1)
    publisher = model_metrics.Publisher(path)
    try:
        publisher.write({"pid": os.getpid(), "families": [counter("long_name_" * 20, 1)]})
        publisher.write({"pid": os.getpid(), "families": []})  # (shorter: the old tail stays in the file)
        assert model_metrics.read(path) == {"pid": os.getpid(), "families": []}
        with path.open("r+b") as f:  # a write under way: its sequence number is odd
            f.write((3).to_bytes(8, "little"))
        assert model_metrics.read(path) is None
    finally:
        publisher.close()
    assert not path.exists()


def test_a_gauge_no_worker_set_yields_to_one_that_was_set(tmp_path: Path, publish) -> None:
    def gauge(value: float, updated: float) -> dict:
        return {"name": "load", "description": "", "kind": "gauge",
                "series": [{"labels": {}, "value": value, "updated": updated}]}

    publish(tmp_path, 0, gauge(4, 50.0))
    publish(tmp_path, 1, gauge(0, 0.0))  # (a standby worker's copy of the model, never executed)

    assert "load 4\n" in exposition(str(tmp_path), reserved=()).decode()
