"""gateway/observe/process_metrics.py and its merge: build info, every process's numbers once, GPUs through a fake NVML,
the version label; the Grafana dashboard's error panels."""
from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import subprocess
import sys
import types
from pathlib import Path

import onnxruntime
import psutil
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ringserve.gateway.observe.process_metrics import (BUILD_INFO, GPU_FAMILIES, PROCESS_FAMILIES, GpuCollector, ProcessesCollector,
                                           ProcessId)
from ringserve.gateway.cluster.merge import Families, gateway_scope, merge_metrics, parse_metrics
from ringserve.gateway.observe.metrics import GatewaySnapshot, Metrics
from ringserve.gateway.cluster.triton_metrics import exposition

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "ringserve.json"


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def empty_snapshot() -> GatewaySnapshot:
    return GatewaySnapshot(queues=[], workers=[], budget_bytes={})


@pytest.fixture
def sleepers():
    """Three real processes to stand for the supervisor and two workers (their /proc is read)."""
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    try:
        yield [child.pid for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()


# -- build info -----------------------------------------------------------------------------------
def test_build_info_names_ringserve_onnxruntime_and_python_versions():
    text = generate_latest(Metrics().registry).decode()

    (info,) = [(labels, value) for name, labels, value in samples(text) if name == BUILD_INFO]
    assert info == ({"version": importlib.metadata.version("ringserve"), "onnxruntime": onnxruntime.__version__,
                     "python": platform.python_version()}, 1.0)


# -- process metrics ------------------------------------------------------------------------------
def test_each_process_gets_prometheus_clients_families_labelled_by_role_and_index(sleepers):
    supervisor, worker0, worker1 = sleepers
    processes = [ProcessId("gateway", 0, psutil.Process().pid), ProcessId("supervisor", 0, supervisor),
                 ProcessId("worker", 0, worker0), ProcessId("worker", 1, worker1)]
    metrics = Metrics()
    metrics.attach(empty_snapshot, lambda: processes)

    found = samples(generate_latest(metrics.registry).decode())

    starts = {(labels["role"], labels["index"]): value for name, labels, value in found
              if name == "process_start_time_seconds"}
    assert starts == pytest.approx({(p.role, str(p.index)): psutil.Process(p.pid).create_time() for p in processes},
                                   abs=0.02)  # (clock ticks: 10 ms)
    names = {name for name, labels, _ in found if name.startswith("process_")}
    assert names == {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                     "process_start_time_seconds", "process_open_fds", "process_max_fds"}


def test_a_process_that_has_exited_drops_out_without_an_error(sleepers):
    pid = sleepers[0]
    collector = ProcessesCollector(lambda: [ProcessId("worker", 0, pid)])
    assert [f for f in collector.collect() if f.samples]
    psutil.Process(pid).kill()
    psutil.Process(pid).wait(10)

    assert [f for f in collector.collect() if f.samples] == []


def gateway_metrics(index: int, supervisor: int, workers: dict[int, int], own_pid: int) -> Metrics:
    """Gateway `index` as GatewayApp wires it (itself, the supervisor, the workers it knows)."""
    metrics = Metrics()
    processes = [ProcessId("gateway", index, own_pid), ProcessId("supervisor", 0, supervisor),
                 *(ProcessId("worker", i, pid) for i, pid in workers.items())]
    metrics.attach(empty_snapshot, lambda: processes)
    return metrics


def test_with_two_gateways_each_process_is_in_the_merged_scrape_once_and_not_summed(sleepers):
    supervisor, worker0, gateway1 = sleepers
    a = gateway_metrics(0, supervisor, {0: worker0}, psutil.Process().pid)
    b = gateway_metrics(1, supervisor, {0: worker0}, gateway1)
    peer_text = generate_latest(Families(gateway_scope(b.registry.collect()))).decode()

    merged = generate_latest(Families(merge_metrics(a.registry.collect(), [parse_metrics(peer_text)],
                                                    {0: True, 1: True}))).decode()

    # The peer's share holds its own process only: the supervisor and the workers are the answering gateway's.
    assert {(labels["role"], labels["index"]) for name, labels, _ in samples(peer_text)
            if name.startswith("process_")} == {("gateway", "1")}
    max_fds = [(labels["role"], labels["index"], value) for name, labels, value in samples(merged)
               if name == "process_max_fds"]
    expected = {("gateway", "0"): psutil.Process().rlimit(psutil.RLIMIT_NOFILE)[0]}
    expected |= {(role, "0" if role != "gateway" else "1"): psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)[0]
                 for role, pid in (("supervisor", supervisor), ("worker", worker0), ("gateway", gateway1))}
    assert sorted((role, index) for role, index, _ in max_fds) == sorted(expected)  # once each
    assert {(role, index): value for role, index, value in max_fds} == expected  # not doubled


def test_a_gateway_scope_share_holds_no_build_info_and_no_gpu():
    names = {f.name for f in gateway_scope(gateway_metrics(0, 0, {}, psutil.Process().pid).registry.collect())}
    assert BUILD_INFO not in names and not names & GPU_FAMILIES
    assert names & PROCESS_FAMILIES


# -- GPUs through NVML ----------------------------------------------------------------------------
class FakeNVMLError(Exception):
    pass


def fake_pynvml(devices: list[tuple[str, int, int, int]], fail_init: bool = False) -> types.ModuleType:
    """A pynvml with `devices` of (uuid, utilisation %, memory used, memory total); each draws 75.5 W."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = FakeNVMLError

    def init():
        if fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")

    nvml.nvmlInit = init
    nvml.nvmlDeviceGetCount = lambda: len(devices)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    nvml.nvmlDeviceGetUUID = lambda h: devices[h[1]][0].encode()  # older bindings return bytes
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=devices[h[1]][1], memory=0)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=devices[h[1]][2], total=devices[h[1]][3],
                                                                   free=devices[h[1]][3] - devices[h[1]][2])
    nvml.nvmlDeviceGetPowerUsage = lambda h: 75_500  # milliwatts
    return nvml


def gpu_samples(metrics: Metrics) -> dict[tuple[str, str], float]:
    return {(name, labels["gpu_uuid"]): value
            for name, labels, value in samples(generate_latest(metrics.registry).decode()) if name in GPU_FAMILIES}


def test_gpu_utilisation_power_and_memory_per_device_come_from_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([("GPU-aaa", 37, 2 << 30, 80 << 30),
                                                            ("GPU-bbb", 0, 0, 80 << 30)]))
    metrics = Metrics()

    assert gpu_samples(metrics) == {
        ("nv_gpu_utilization", "GPU-aaa"): 0.37, ("nv_gpu_memory_used_bytes", "GPU-aaa"): 2 << 30,
        ("nv_gpu_memory_total_bytes", "GPU-aaa"): 80 << 30, ("nv_gpu_power_usage", "GPU-aaa"): 75.5,
        ("nv_gpu_utilization", "GPU-bbb"): 0.0, ("nv_gpu_memory_used_bytes", "GPU-bbb"): 0,
        ("nv_gpu_memory_total_bytes", "GPU-bbb"): 80 << 30, ("nv_gpu_power_usage", "GPU-bbb"): 75.5}


def test_gpu_families_are_what_perf_analyzers_collect_metrics_parses(monkeypatch):
    """perf_analyzer (src/client_backend/triton/triton_client_backend.h) finds a GPU metric with this
    regex only: `gpu_uuid` must be the sample's one label."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([("GPU-aaa", 37, 2 << 30, 80 << 30)]))
    text = "\n" + exposition(Metrics().registry.collect()).decode()  # (/metrics's text)

    found = {name: re.findall("\n" + name + r'\{gpu_uuid\="([^"]+)"\} (\d+\.?\d*)', text)
             for name in ("nv_gpu_utilization", "nv_gpu_power_usage", "nv_gpu_memory_used_bytes",
                          "nv_gpu_memory_total_bytes")}
    assert found == {"nv_gpu_utilization": [("GPU-aaa", "0.37")], "nv_gpu_power_usage": [("GPU-aaa", "75.5")],
                     "nv_gpu_memory_used_bytes": [("GPU-aaa", str(2 << 30))],
                     "nv_gpu_memory_total_bytes": [("GPU-aaa", str(80 << 30))]}


@pytest.mark.parametrize("nvml", ["absent", "no driver", "no GPU"])
def test_without_nvml_a_driver_or_a_gpu_there_is_no_gpu_family_and_no_error(monkeypatch, nvml):
    module = {"absent": None, "no driver": fake_pynvml([], fail_init=True), "no GPU": fake_pynvml([])}[nvml]
    monkeypatch.setitem(sys.modules, "pynvml", module)  # None: `import pynvml` raises ImportError
    metrics = Metrics()

    assert gpu_samples(metrics) == {}
    assert gpu_samples(metrics) == {}  # (and the next scrape does not try again)


def test_a_device_whose_read_fails_is_left_out_of_that_scrape(monkeypatch):
    nvml = fake_pynvml([("GPU-aaa", 50, 1, 2), ("GPU-bbb", 60, 1, 2)])
    real = nvml.nvmlDeviceGetMemoryInfo

    def memory(handle):
        if handle[1] == 0:
            raise FakeNVMLError("GPU is lost")
        return real(handle)

    nvml.nvmlDeviceGetMemoryInfo = memory
    collector = GpuCollector(lambda: nvml)

    families = {f.name: {s.labels["gpu_uuid"] for s in f.samples} for f in collector.collect()}
    assert families == {name: {"GPU-bbb"} for name in GPU_FAMILIES}


# -- the version label ----------------------------------------------------------------------------
def test_two_versions_of_one_model_are_told_apart_and_unknown_names_share_one_label():
    metrics = Metrics()
    for version, code in [(1, 200), (2, 200), (2, 200), (2, 503), (0, 404)]:
        metrics.count_request("m" if version else "_unknown", version, code)
    metrics.request_seconds.observe("m", 1, 0.01)
    metrics.request_seconds.observe("m", 2, 0.01)

    found = samples(generate_latest(metrics.registry).decode())

    requests = {(labels["model"], labels["version"], labels["code"]): value for name, labels, value in found
                if name == "ringserve_requests_total"}
    assert requests == {("m", "1", "200"): 1, ("m", "2", "200"): 2, ("m", "2", "503"): 1, ("_unknown", "", "404"): 1}
    counts = {labels["version"]: value for name, labels, value in found if name == "ringserve_request_seconds_count"}
    assert counts == {"1": 1, "2": 1}


# -- the Grafana dashboard ------------------------------------------------------------------------
def dashboard_queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in doc["panels"] for target in panel.get("targets", [])]


def test_the_dashboard_counts_only_5xx_as_server_errors():
    with_code = [q for q in dashboard_queries() if "ringserve_requests_total" in q and "code" in q
                 and "sum by (code)" not in q]
    assert with_code, "no error panel found"
    for query in with_code:
        assert 'code=~"5.."' in query and 'code!="200"' not in query, query


def test_the_dashboard_tells_model_versions_apart_and_shows_every_process():
    queries = dashboard_queries()
    per_model = [q for q in queries if "by (le, model" in q or "by (model" in q]
    assert per_model and all("version" in q for q in per_model), [q for q in per_model if "version" not in q]
    assert any("process_resident_memory_bytes" in q for q in queries)
    assert any("process_cpu_seconds_total" in q for q in queries)


# -- what the gateway wires ---------------------------------------------------------------------
def test_the_gateway_reports_itself_its_supervisor_and_the_serving_workers():
    from ringserve.gateway.process import server_processes

    found = server_processes(1, 4242, lambda: {1: 501, 0: 500})
    assert found == [ProcessId("gateway", 1, psutil.Process().pid), ProcessId("supervisor", 0, 4242),
                     ProcessId("worker", 0, 500), ProcessId("worker", 1, 501)]
    assert [p.role for p in server_processes(0, 0, dict)] == ["gateway"]  # started by hand: no supervisor


def test_only_requests_that_came_in_on_the_metrics_port_are_held_to_it():
    from ringserve.gateway.http.app import on_port

    assert on_port({"server": ("0.0.0.0", 8002)}, 8002)
    assert not on_port({"server": ("0.0.0.0", 8000)}, 8002)
    assert not on_port({"server": ("/run/ringserve/gateway-1.http", None)}, 8002)  # a peer, on its Unix socket
    assert not on_port({}, 8002)


# -- the warm spares ------------------------------------------------------------------------------
def test_the_warm_spares_are_counted_per_device_once_however_many_gateways_answer():
    from ringserve.common.supervisor_messages import SpareInfo

    spares = [SpareInfo(device=0, pid=11, state="ready", rss_bytes=90 << 20, takeovers=3, deaths={"SIGKILL": 1}),
              SpareInfo(device=1, state="none", deaths={"hung": 2})]
    gateways = []
    for _ in range(2):  # two gateways, each with the supervisor's same snapshot
        metrics = Metrics()
        metrics.attach(lambda: GatewaySnapshot(queues=[], workers=[], budget_bytes={}, spares=spares), lambda: [])
        gateways.append(metrics)
    peer_text = generate_latest(Families(gateway_scope(gateways[1].registry.collect()))).decode()

    merged = samples(generate_latest(Families(merge_metrics(gateways[0].registry.collect(),
                                                            [parse_metrics(peer_text)], {0: True, 1: True}))).decode())

    found = {(name, tuple(sorted(labels.items()))): value for name, labels, value in merged
             if name.startswith("ringserve_spare_")}
    assert found == {
        ("ringserve_spare_takeovers_total", (("device", "0"),)): 3.0,
        ("ringserve_spare_takeovers_total", (("device", "1"),)): 0.0,
        ("ringserve_spare_deaths_total", (("device", "0"), ("reason", "SIGKILL"))): 1.0,
        ("ringserve_spare_deaths_total", (("device", "1"), ("reason", "hung"))): 2.0,
        ("ringserve_spare_memory_bytes", (("device", "0"),)): float(90 << 20),
        ("ringserve_spare_memory_bytes", (("device", "1"),)): 0.0}


def test_answered_requests_are_counted_by_model_version_and_code_as_a_prometheus_counter():
    metrics = Metrics()
    for model, version, code in [("mlp", 1, 200), ("mlp", 1, 200), ("mlp", 2, 503), ("nope", 0, 404)]:
        metrics.count_request(model, version, code)

    text = generate_latest(metrics.registry).decode()

    assert "# TYPE ringserve_requests_total counter" in text
    got = {(s[1]["model"], s[1]["version"], s[1]["code"]): s[2] for s in samples(text) if s[0] == "ringserve_requests_total"}
    assert got == {("mlp", "1", "200"): 2.0, ("mlp", "2", "503"): 1.0, ("nope", "", "404"): 1.0}
