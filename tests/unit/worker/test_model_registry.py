"""worker/models.py with real ONNX Runtime sessions of small models and real RSS measurements."""
from __future__ import annotations

import dataclasses
import itertools
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq

from prometheus_client import generate_latest

from ringserve.common.errors import ConfigError
from ringserve.common.repository.lifecycle import Lifecycle
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.scan import scan_repository
from ringserve.common.repository.demo import build_slow_model
from ringserve.common import messages, wire
from ringserve.gateway.observe.metrics import Metrics
from ringserve.worker.footprint import one_heap
from ringserve.worker.errors import BudgetExhausted, ModelLoadFailed, ModelNotReady, ModelNotServed
from ringserve.worker.threads import EventOutbox, ModelLoader
from ringserve.worker.models import ModelRegistry
from ringserve.worker.onnx_model import OnnxModel
from ringserve.worker.session import CPU, prime_runtime
from ringserve.worker.warmup import WarmupFailed, run_sample

from tests.support.models import session_settings
from tests.support.lifecycle_models import build_corrupt, build_versioned
from tests.support.stack import poll_for

SETTINGS = session_settings()
WEIGHT_BYTES = 1 << 20


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("lifecycle")
    for i in range(6):
        build_versioned(repo, f"m{i}", weight_bytes=WEIGHT_BYTES, model_load_policy="lazy")
    build_versioned(repo, "idle", weight_bytes=WEIGHT_BYTES, model_load_policy="lazy", ttl_s=5)
    build_versioned(repo, "multi", (1, 2, 3), weight_bytes=4096, version_policy={"all": {}})
    build_slow_model(repo / "slow", width=384, layers=64)
    build_corrupt(repo, "broken")
    one_heap()  # as the worker does: RSS deltas are only trustworthy with one heap (worker/footprint.py)
    prime_runtime(SETTINGS, [CPU])  # and ORT's one-time setup is nobody's footprint
    return repo


@pytest.fixture(scope="module")
def configs(repo: Path) -> dict[str, ModelConfig]:
    return {c.key: c for c in scan_repository(repo).all_versions()}


def open_session(config: ModelConfig) -> OnnxModel:
    return OnnxModel(config, SETTINGS, [CPU])


class Registry(ModelRegistry):
    """A registry over some of the test models that records what it tells the gateway."""

    def __init__(self, configs: dict[str, ModelConfig], keys: list[str], **kwargs) -> None:
        self.events: list[messages.ModelState] = []
        super().__init__([configs[k] for k in keys], open_session=kwargs.pop("open_session", open_session),
                         notify=self.events.append, **kwargs)

    def use(self, model: str, version: int | None = None) -> None:
        """What the batch loop does around one batch."""
        self.release(self.acquire(model, version))

    def evicted(self) -> list[str]:
        return [e.report.model for e in self.events if e.report.state == "unloaded" and e.cause == "lru"]

    def loads(self, model: str) -> int:
        return sum(1 for e in self.events if e.report.model == model and e.loaded)

    def state(self, model: str, version: int | None = None) -> str:
        return self.entry(model, version).state


@pytest.fixture(scope="module")
def footprint_bytes(configs) -> int:
    """What one of the m* models measures when loaded (they are all the same size)."""
    probe = Registry(configs, ["m0"])
    probe.use("m0")
    return probe.entry("m0").memory_bytes


def test_a_lazy_model_loads_on_first_use_and_its_footprint_is_measured(configs):
    registry = Registry(configs, ["m0"])
    assert registry.state("m0") == "unloaded"

    entry = registry.acquire("m0")

    assert entry.state == "ready" and entry.refs == 1
    assert entry.session.run({"x": np.ones((2, 4), np.float32)})[0].ravel().tolist() == pytest.approx([5.0, 5.0])
    # Measured, not guessed: the weights are 1 MiB, and a session holds them plus its own structures.
    assert WEIGHT_BYTES * 0.9 < entry.memory_bytes < WEIGHT_BYTES * 4
    assert [(e.report.state, e.cause) for e in registry.events] == [("loading", "lazy"), ("ready", "lazy")]
    assert registry.events[-1].loaded and registry.events[-1].report.memory_bytes == entry.memory_bytes
    registry.release(entry)
    assert entry.refs == 0 and entry.state == "ready"


def test_six_models_under_a_budget_for_three_evict_the_least_recently_used(configs, footprint_bytes):
    registry = Registry(configs, [f"m{i}" for i in range(6)], budget_bytes=int(footprint_bytes * 3.5),
                        clock=itertools.count().__next__)
    for name in ("m0", "m1", "m2", "m0"):
        registry.use(name)
    assert registry.evicted() == []

    registry.use("m3")  # m1 is the least recently used: m0 was used again after it
    registry.use("m4")
    registry.use("m0")
    registry.use("m5")

    assert registry.evicted() == ["m1", "m2", "m3"]
    assert {e.config.name for e in registry.entries.values() if e.state == "ready"} == {"m0", "m4", "m5"}
    assert registry.used_bytes() <= registry.budget_bytes


def test_a_model_in_use_during_a_long_batch_is_never_evicted(configs):
    probe = Registry(configs, ["slow", "m0"])
    probe.use("slow")
    probe.use("m0")
    slow_bytes, m0_bytes = probe.entry("slow").memory_bytes, probe.entry("m0").memory_bytes
    registry = Registry(configs, ["slow", "m0"], budget_bytes=slow_bytes + m0_bytes // 2)
    registry.load("slow", 1, "eager")  # fits alone; slow and m0 together do not
    x = np.random.default_rng(1).standard_normal((64, 384)).astype(np.float32)
    answers = []

    def batch() -> None:  # the batch loop, running one long batch on the slow model
        entry = registry.acquire("slow")
        try:
            answers.append(entry.session.run({"x": x})[0])
        finally:
            registry.release(entry)

    running = threading.Thread(target=batch)
    running.start()
    poll_for(lambda: registry.entry("slow").refs == 1, 30, what="the slow batch to hold its model")
    with pytest.raises(BudgetExhausted) as refused:  # the loader thread, asked for m0 meanwhile
        registry.load("m0", 1, "lazy")
    still_running = running.is_alive()
    running.join()

    assert still_running, "the slow batch must outlast the refused load for this test to mean anything"
    assert registry.state("slow") == "ready" and registry.evicted() == []
    np.testing.assert_allclose(answers[0], probe.entry("slow").session.run({"x": x})[0], rtol=1e-5)
    message = str(refused.value)
    assert message.startswith("model memory budget exhausted: model 'm0' version 1 needs ")
    assert f"the budget is {registry.budget_bytes} bytes" in message and "(slow version 1)" in message
    assert registry.events[-1].cause == "budget" and registry.events[-1].report.reason == message
    # Once the batch is done the slow model is idle, and the same load evicts it.
    registry.load("m0", 1, "lazy")
    assert registry.evicted() == ["slow"] and registry.state("m0") == "ready"


def test_a_model_bigger_than_the_whole_budget_is_refused_with_the_numbers(configs, footprint_bytes):
    registry = Registry(configs, ["m0", "m1"], budget_bytes=footprint_bytes // 4)
    with pytest.raises(BudgetExhausted, match=rf"needs \d+ bytes \([\d.]+ MiB\); the budget is "
                                              rf"{footprint_bytes // 4} bytes"):
        registry.acquire("m0")
    assert registry.state("m0") == "unloaded" and registry.used_bytes() == 0


def test_ttl_unloads_an_idle_model_and_never_a_referenced_one(configs):
    now = [0.0]
    registry = Registry(configs, ["idle", "m0"], clock=lambda: now[0])
    entry = registry.acquire("idle")
    registry.use("m0")  # no ttl_s: never unloaded for idleness
    now[0] = 10.0
    registry.reap()
    assert registry.state("idle") == "ready"  # referenced: a batch is running on it
    registry.release(entry)  # last used at 10

    now[0] = 14.9
    registry.reap()
    assert registry.state("idle") == "ready"
    now[0] = 15.0
    registry.reap()

    assert registry.state("idle") == "unloaded" and registry.state("m0") == "ready"
    last = registry.events[-1]
    assert (last.report.model, last.report.state, last.cause) == ("idle", "unloaded", "ttl")
    assert registry.entry("idle").memory_bytes == 0


def test_twenty_concurrent_first_requests_load_the_model_once(configs):
    registry = Registry(configs, ["m0"])
    start = threading.Barrier(20)
    errors = []

    def request() -> None:
        start.wait()
        try:
            registry.use("m0")
        except Exception as exc:  # noqa: BLE001 - collected for the assert below
            errors.append(exc)

    threads = [threading.Thread(target=request) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and registry.loads("m0") == 1 and registry.entry("m0").refs == 0


def test_the_loader_thread_takes_loads_on_its_own_socket_and_reports_each_change(configs, tmp_path):
    registry = Registry(configs, ["m0", "m1"])
    outbox = EventOutbox()
    registry.notify = outbox.put  # as the worker wires it: each thread sends what it changed
    context = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    endpoint = wire.endpoint(str(tmp_path), "dispatch")  # ipc, as in the worker: inproc has no handshake
    router.bind(endpoint)
    loader = ModelLoader(registry, outbox, context=context, endpoints=[endpoint], index=0, generation=1)
    assert loader.connections[0].monitor.poll(10_000)  # its handshake: the ROUTER can route to it
    loader.start()
    reports = []
    try:
        for model in ("m0", "m0", "m1"):
            router.send_multipart([b"c0.g1", *messages.Load(model=model, version=1).encode()])

        def collect() -> bool:
            while router.poll(10):
                identity, *frames = router.recv_multipart()
                reports.append((identity, messages.decode(frames)))
            return len(reports) >= 5
        poll_for(collect, 30, what="the loader's reports")
    finally:
        loader.stop()
        loader.join(5)
        loader.close_monitors()
        router.close(linger=0)
    assert all(identity == b"c0.g1" and isinstance(m, messages.ModelState) for identity, m in reports)
    assert [(m.report.model, m.report.state) for _, m in reports] == [
        ("m0", "loading"), ("m0", "ready"),
        ("m0", "ready"),  # a Load for a loaded version is answered with its state
        ("m1", "loading"), ("m1", "ready")]
    assert [m.report.seq for _, m in reports if m.report.model == "m0"] == [1, 2, 3]
    assert registry.loads("m0") == 0  # its events went to the socket, not to the test's list


def test_a_corrupt_model_fails_with_the_runtimes_message_and_the_others_serve(configs):
    registry = Registry(configs, ["broken", "m0"])
    registry.load_eager(worker_index=0)  # broken is eager; m0 is lazy

    assert registry.state("broken") == "failed"
    reason = registry.entry("broken").reason
    assert "INVALID_PROTOBUF" in reason and "model.onnx failed:Protobuf parsing failed" in reason
    with pytest.raises(ModelLoadFailed, match="INVALID_PROTOBUF"):
        registry.acquire("broken")
    registry.use("m0")
    assert registry.state("m0") == "ready"
    # A repository load retries it (cause api); it fails the same way while the file is corrupt.
    with pytest.raises(ModelLoadFailed):
        registry.load("broken", 1, "api")
    assert registry.loads("broken") == 0


def test_an_api_unload_of_a_model_in_use_waits_for_its_last_reference(configs):
    registry = Registry(configs, ["m0"])
    entry = registry.acquire("m0")
    assert registry.unload("m0", 1, "api") is False
    registry.reap()
    assert registry.state("m0") == "ready"
    registry.release(entry)
    registry.reap()
    assert registry.state("m0") == "unloaded"
    assert registry.events[-1].cause == "api"


def test_eager_models_load_at_start_but_never_evict_each_other(configs, footprint_bytes):
    eager = {k: dataclasses.replace(c, extra={**c.extra, "model_load_policy": "eager"}) for k, c in configs.items()}
    registry = Registry(eager, [f"m{i}" for i in range(6)], budget_bytes=int(footprint_bytes * 3.5))
    registry.load_eager(worker_index=0)
    ready = [e.config.name for e in registry.entries.values() if e.state == "ready"]
    assert ready == ["m0", "m1", "m2"] and registry.evicted() == []
    registry.use("m5")  # a request still gets it, evicting the least recently used
    assert registry.evicted() == ["m0"]


def test_versions_are_separate_entries_and_no_version_means_the_default(configs):
    registry = Registry(configs, ["multi/1", "multi/2", "multi"])
    registry.use("multi")
    registry.use("multi", 1)
    assert [registry.state("multi", v) for v in (1, 2, 3)] == ["ready", "unloaded", "ready"]
    out = registry.acquire("multi", 1).session.run({"x": np.zeros((1, 4), np.float32)})[0]
    assert out.ravel().tolist() == [1.0]
    with pytest.raises(ModelNotServed, match="model 'multi' version 4 is not served"):
        registry.acquire("multi", 4)


class PlainSession:
    provider = CPU


def test_warmup_runs_once_per_load_when_asked(configs):
    warm = dataclasses.replace(configs["m0"], extra={**configs["m0"].extra, "warmup": True})
    warmed: list[str] = []
    registry = Registry({"m0": warm, "m1": configs["m1"]}, ["m0", "m1"], open_session=lambda c: PlainSession(),
                        warm=lambda config, session: warmed.extend(s.name for s in config.warmup_samples))
    registry.use("m0")
    registry.use("m1")
    assert warmed == ["warmup"]  # m0's `warmup: true`; m1 has no sample


def test_a_warmup_that_fails_on_zeros_leaves_the_model_serving(configs):
    """`warmup: true` names no data: zeros may not be the model's valid input, so its failure is only logged."""
    class Picky(PlainSession):  # (a Runner whose warm-up fails, as an ONNX session refusing zeros does)
        def run_warmup(self, sample, one):
            return ["zeros are not a valid input here"]

    warm = dataclasses.replace(configs["m0"], extra={**configs["m0"].extra, "warmup": True})
    registry = Registry({"m0": warm}, ["m0"], open_session=lambda c: Picky())
    registry.use("m0")
    assert registry.state("m0") == "ready"


def test_a_model_warmup_sample_that_fails_fails_the_load_with_tritons_words(configs):
    sample = {"name": "zero sample", "batch_size": 2,
              "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [4], "input_data_file": "missing"}}}
    doc = {**configs["m0"].to_json(), "model_warmup": [sample]}
    config = ModelConfig.from_json("m0", doc, version=1, model_path=configs["m0"].model_path)
    registry = Registry({"m0": config}, ["m0"])
    with pytest.raises(ModelLoadFailed, match="failed to run warmup sample 'zero sample': .*No such file.*missing'; $"):
        registry.use("m0")
    assert registry.state("m0") == "failed"
    assert registry.entry("m0").reason.startswith("failed to run warmup sample 'zero sample': ")


@pytest.mark.parametrize("model", ["m0", "slow"])
def test_real_warmup_feeds_zeros_of_every_input(configs, model):
    warm = dataclasses.replace(configs[model], extra={**configs[model].extra, "warmup": True})
    run_sample(warm, open_session(warm), warm.warmup_samples[0])  # raises WarmupFailed if ORT refused the feeds


# -- eviction priority, budget refusals and peak references ---------------------------------------------
def with_priority(config: ModelConfig, priority: int) -> ModelConfig:
    return dataclasses.replace(config, extra={**config.extra, "eviction_priority": priority})


def test_a_lower_eviction_priority_is_evicted_later_whatever_was_used_last(configs, footprint_bytes):
    ranked = {**configs, "m0": with_priority(configs["m0"], -1), "m2": with_priority(configs["m2"], 5)}
    registry = Registry(ranked, ["m0", "m1", "m2", "m3"], budget_bytes=int(footprint_bytes * 3.5),
                        clock=itertools.count().__next__)
    for name in ("m0", "m1", "m2"):  # m0 is the least recently used, m2 the most
        registry.use(name)

    registry.use("m3")  # evicts m2: priority 5 goes before the default 0 and m0's -1
    registry.use("m2")  # evicts m1 (0), not m0 (-1), although m0 is the least recently used

    assert registry.evicted() == ["m2", "m1"]
    assert registry.state("m0") == "ready"


@pytest.mark.parametrize("value", ["high", 1.5, True, None])
def test_eviction_priority_must_be_an_integer(value):
    with pytest.raises(ConfigError, match="eviction_priority"):
        Lifecycle.from_config_doc({"eviction_priority": value})


def test_eviction_priority_defaults_to_zero_and_reads_negative_numbers():
    assert Lifecycle.from_config_doc({}).eviction_priority == 0
    assert Lifecycle.from_config_doc({"eviction_priority": -2}).eviction_priority == -2
    assert Lifecycle.from_config_doc({"eviction_priority": "7"}).eviction_priority == 7  # protobuf JSON's int64


def test_the_peak_of_references_is_reported_once_per_new_peak(configs):
    registry = Registry(configs, ["m0"])
    first = registry.acquire("m0")  # loads it: READY's report carries the first peak
    second = registry.acquire("m0")
    registry.release(second)
    registry.release(registry.acquire("m0"))  # back to 2 at most: no new peak

    peaks = [(e.cause, e.report.state, e.report.peak_refs) for e in registry.events if e.report.peak_refs]
    assert peaks == [("lazy", "ready", 1), ("peak", "ready", 2)]
    registry.release(first)
    assert registry.entry("m0").peak_refs == 2 and registry.describe()[0].peak_refs == 2


def scrape(metrics: Metrics) -> dict[str, float]:
    """The samples of the two budget metrics, by series name and labels."""
    return {f"{s.name}{{{s.labels['model']}/{s.labels['version']}}}": s.value
            for family in metrics.registry.collect() for s in family.samples
            if s.name in ("ringserve_model_budget_exhausted_total", "ringserve_model_peak_references")}


def test_budget_refusals_and_peak_references_reach_the_gateways_metrics(configs, footprint_bytes):
    metrics = Metrics()
    registry = Registry(configs, ["m0", "m1"], budget_bytes=int(footprint_bytes * 1.5))
    registry.notify = lambda change: (registry.events.append(change), metrics.observe_model_state(change))
    held = [registry.acquire("m0"), registry.acquire("m0")]  # two batches hold m0: the budget is full
    for _ in range(2):
        with pytest.raises(BudgetExhausted):
            registry.load("m1", 1, "lazy")
    for entry in held:
        registry.release(entry)
    registry.use("m1")  # m0 is idle now: evicted, and m1 loads

    assert scrape(metrics) == {"ringserve_model_budget_exhausted_total{m1/1}": 2.0,
                               "ringserve_model_peak_references{m0/1}": 2.0,
                               "ringserve_model_peak_references{m1/1}": 1.0}
    assert "# TYPE ringserve_model_budget_exhausted_total counter" in generate_latest(metrics.registry).decode()


def test_a_load_that_asks_for_a_model_not_loaded_gets_not_ready_at_once_and_a_loaded_one_serves_it(configs) -> None:
    """A BLS request in a Python model's initialize: acquire from inside a load (it once deadlocked on
    the registry's load lock)."""
    seen: dict[str, object] = {}

    def open_calling(config: ModelConfig) -> OnnxModel:
        if config.name == "m1":
            for target in ("m0", "m2", "m1"):  # ready; unloaded; the very one loading
                try:
                    registry.release(registry.acquire(target))
                    seen[target] = "served"
                except (ModelNotReady, ModelLoadFailed) as exc:
                    seen[target] = str(exc)
        return open_session(config)

    registry = Registry(configs, ["m0", "m1", "m2"], open_session=open_calling)
    registry.load("m0", 1, cause="api")
    caller = threading.Thread(target=registry.load, args=("m1", 1), kwargs={"cause": "api"}, daemon=True)
    caller.start()
    caller.join(timeout=30)

    assert not caller.is_alive() and registry.state("m1") == "ready"
    assert seen["m0"] == "served"
    assert "is not ready (unloaded)" in seen["m2"] and "is not ready (loading)" in seen["m1"]
    registry.use("m2")  # outside a load, acquire loads it as always


def test_a_warmup_file_shorter_than_its_sample_fails_the_load_in_tritons_words(configs, repo):
    base = configs["m1"]
    (tensor,) = base.inputs
    (repo / "m1" / "warmup").mkdir(exist_ok=True)
    (repo / "m1" / "warmup" / "short").write_bytes(b"\0" * 8)
    given = {"data_type": "TYPE_FP32", "dims": list(tensor.dims), "input_data_file": "short"}
    doc = {**base.to_json(), "model_warmup": [{"name": "file", "batch_size": 1, "inputs": {tensor.name: given}}]}
    config = ModelConfig.from_json("m1", doc, version=1, model_path=base.model_path)
    need = 4 * int(np.prod(tensor.dims))
    with pytest.raises(WarmupFailed) as info:
        run_sample(config, open_session(config), config.warmup_samples[0])
    assert str(info.value) == (f"failed to run warmup sample 'file': warmup setting expects {need} bytes, "
                               "but the data provided from short only has 8 bytes; ")
