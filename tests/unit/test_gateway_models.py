"""gateway/dispatch/model_states.py and fleet.py through the dispatcher: lazy loads, versions, model states, refusals, metrics.

Workers are simulated as in test_dispatch.py: the messages a worker would send are fed to the
dispatcher, and what it sends back (BATCH, LOAD, UNLOAD) is recorded by the fake port.
"""
from __future__ import annotations

import numpy as np
import pytest

from ringserve.common.messages import ModelState, ModelStateReport, Ready, Unload
from ringserve.common.repository.batching import DynamicBatching
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.repository.scan import RepositoryScan
from ringserve.gateway.core.errors import Unavailable
from ringserve.gateway.core.settings import DispatchSettings

from tests.support.gateway_fakes import dispatch_settings
from .test_dispatch import Harness, rows

BUDGET_MESSAGE = ("model memory budget exhausted: model 'lazy' version 2 needs 3000000 bytes (2.9 MiB); the budget "
                  "is 4000000 bytes (3.8 MiB) and 2500000 bytes (2.4 MiB) are held by models that cannot be evicted "
                  "now (other version 1)")


def lazy(version: int, default: bool, **extra) -> ModelConfig:
    return ModelConfig(name="lazy", max_batch_size=32, inputs=(TensorConfig("x", "FP32", (4,)),),
                       outputs=(TensorConfig("y", "FP32", (4,)),), dynamic_batching=DynamicBatching(),
                       version=version, model_path=f"/models/lazy/{version}/model.onnx",
                       extra={"model_load_policy": "lazy", **extra}, default_version=default)


class LifecycleHarness(Harness):
    """A dispatcher serving 'lazy' versions 1 and 2 (2 is the default), fed lifecycle reports."""

    def __init__(self, segment, loop, settings: DispatchSettings, **extra) -> None:
        self.v1, self.v2 = lazy(1, False, **extra), lazy(2, True, **extra)
        super().__init__(segment, loop, settings, configs={"lazy": self.v2})
        self.dispatcher.catalog.add_repository(RepositoryScan({"lazy": (self.v1, self.v2)}, {"gone": "unreadable"}))

    def ready_with(self, index: int, generation: int, states: dict[int, str], budget: int = 0) -> None:
        self.dispatcher.on_worker_message(index, generation, Ready(
            worker_index=index, generation=generation, pid=1000 + generation, models={}, memory_budget_bytes=budget,
            model_states=tuple(self.report(v, s) for v, s in states.items())))

    @staticmethod
    def report(version: int, state: str, reason: str = "") -> ModelStateReport:
        return ModelStateReport(model="lazy", version=version, key="lazy" if version == 2 else f"lazy/{version}",
                                state=state, reason=reason, policy="lazy",
                                memory_bytes=1_000_000 if state == "ready" else 0, load_s=0.25,
                                provider="CPUExecutionProvider" if state == "ready" else None)

    def model_state(self, index: int, generation: int, version: int, state: str, reason: str = "",
                    **change) -> None:
        self.dispatcher.on_worker_message(index, generation,
                                          ModelState(report=self.report(version, state, reason), **change))

    def submit_to(self, config: ModelConfig, x):
        return self.submit(x, config)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def harness(segment, loop):
    return LifecycleHarness(segment, loop, dispatch_settings(max_inflight_per_worker=1))


def test_twenty_concurrent_first_requests_ask_for_one_load_and_wait_in_the_queue(harness):
    harness.ready_with(0, 1, {1: "unloaded", 2: "unloaded"})
    requests = [harness.submit_to(harness.v2, rows(1, 10.0 * i)) for i in range(20)]

    assert harness.port.loads() == [("c0.g1", "lazy", 2)]
    assert harness.sent == [] and not any(r.future.done() for r in requests)
    assert harness.dispatcher.models.state_of("lazy") == ("loading", "a worker is loading it")

    harness.model_state(0, 1, 2, "ready", cause="lazy", loaded=True)

    (sent,) = harness.sent  # every waiting request in one batch, to the version that loaded
    assert (sent.batch.model, sent.batch.version, sent.batch.inputs[0][2]) == ("lazy", 2, [20, 4])
    harness.answer(sent)
    assert all(np.array_equal(r.future.result()["y"], 2 * r.inputs["x"] + 1) for r in requests)
    assert harness.sample("ringserve_model_loads_total", model="lazy", version="2", policy="lazy") == 1
    assert harness.sample("ringserve_model_load_seconds_count", model="lazy", version="2") == 1
    assert harness.port.loads() == [("c0.g1", "lazy", 2)]


def test_a_versioned_request_reaches_exactly_its_version(harness):
    harness.ready_with(0, 1, {1: "ready", 2: "ready"})
    old = harness.submit_to(harness.v1, rows(1, 1.0))
    (first,) = harness.sent
    harness.answer(first)
    new = harness.submit_to(harness.v2, rows(1, 2.0))
    second = harness.sent[1]

    assert (first.batch.version, second.batch.version) == (1, 2)
    assert old.future.done() and harness.dispatcher.queues["lazy/1"].config is harness.v1
    assert not new.future.done()


def test_a_failed_load_answers_the_waiting_requests_with_the_runtimes_message(harness):
    harness.ready_with(0, 1, {1: "unloaded", 2: "unloaded"})
    waiting = harness.submit_to(harness.v2, rows(1, 0.0))
    reason = "InvalidProtobuf: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Protobuf parsing failed."

    harness.model_state(0, 1, 2, "failed", reason=reason, cause="lazy")

    with pytest.raises(Unavailable, match="failed to load .*INVALID_PROTOBUF") as failed:
        waiting.future.result()
    with pytest.raises(Unavailable, match="INVALID_PROTOBUF") as later:  # and so does every later request
        harness.dispatcher.submit(harness.request(rows(1, 0.0), harness.v2))
    assert failed.value.headers == later.value.headers == {}  # no Retry-After: retrying cannot help
    assert harness.dispatcher.models.state_of("lazy")[0] == "failed"
    harness.dispatcher.check_available("lazy/1")  # the other version still serves


def test_a_load_the_budget_refuses_gives_the_waiting_requests_503_with_the_numbers(harness):
    harness.ready_with(0, 1, {1: "ready", 2: "unloaded"}, budget=4_000_000)
    waiting = [harness.submit_to(harness.v2, rows(1, 0.0)) for _ in range(3)]

    harness.model_state(0, 1, 2, "unloaded", cause="budget", reason=BUDGET_MESSAGE)

    for request in waiting:
        with pytest.raises(Unavailable) as info:
            request.future.result()
        assert str(info.value) == BUDGET_MESSAGE and info.value.headers == {"retry-after": "1"}
    assert harness.dispatcher.models.state_of("lazy")[0] == "unloaded"  # still servable: the next one retries
    assert harness.sample("ringserve_model_memory_budget_bytes", worker="0") == 4_000_000


def test_an_error_for_a_batch_that_never_ran_is_503_for_each_request_and_not_bisected(harness):
    harness.ready_with(0, 1, {1: "ready", 2: "ready"})
    first = harness.submit_to(harness.v2, rows(1, 0.0))
    others = [harness.submit_to(harness.v2, rows(1, float(i))) for i in range(2)]  # wait for the first batch

    for position in (0, 1):  # the second batch (both waiting requests) forms after the first is answered
        harness.error(harness.sent[position], BUDGET_MESSAGE, kind="budget")

    assert len(harness.sent) == 2 and harness.sent[1].batch.inputs[0][2] == [2, 4]  # no halves were tried
    for request in [first, *others]:
        with pytest.raises(Unavailable, match="model memory budget exhausted"):
            request.future.result()


def test_a_worker_that_died_while_loading_blames_none_of_its_batches(harness):
    harness.ready_with(0, 1, {1: "ready", 2: "ready"})
    harness.submit_to(harness.v2, rows(1, 0.0))
    (sent,) = harness.sent
    harness.exited(0, 1, reason="SIGSEGV", loading_model="lazy/1")
    harness.ready_with(0, 2, {1: "ready", 2: "ready"})

    resent = harness.sent[1]
    assert (resent.batch.batch_id, resent.batch.attempt) == (sent.batch.batch_id, 0)


def test_unloads_are_counted_by_reason_and_memory_is_exported_per_version(harness):
    harness.ready_with(0, 1, {1: "ready", 2: "ready"})
    assert harness.sample("ringserve_model_loads_total", model="lazy", version="1", policy="lazy") == 1
    assert harness.sample("ringserve_model_memory_bytes", model="lazy", version="1", worker="0") == 1_000_000

    harness.model_state(0, 1, 1, "unloading", cause="lru")
    harness.model_state(0, 1, 1, "unloaded", cause="lru")
    harness.model_state(0, 1, 2, "unloaded", cause="ttl")

    assert harness.sample("ringserve_model_unloads_total", model="lazy", version="1", reason="lru") == 1
    assert harness.sample("ringserve_model_unloads_total", model="lazy", version="2", reason="ttl") == 1
    assert harness.sample("ringserve_model_memory_bytes", model="lazy", version="1", worker="0") is None


@pytest.mark.parametrize("instance_group, spills", [([], True), ([{"count": 1}], False)])
def test_a_busy_worker_spills_to_another_one_up_to_the_instance_count(segment, loop, instance_group, spills):
    h = LifecycleHarness(segment, loop, dispatch_settings(max_inflight_per_worker=1), instance_group=instance_group)
    h.ready_with(0, 1, {1: "unloaded", 2: "ready"})
    h.ready_with(1, 1, {1: "unloaded", 2: "unloaded"})
    h.submit_to(h.v2, rows(1, 0.0))  # goes to worker 0, which then has no room
    h.submit_to(h.v2, rows(1, 1.0))

    assert len(h.sent) == 1 and h.sent[0].identity == b"w0.g1"
    assert h.port.loads() == ([("c1.g1", "lazy", 2)] if spills else [])


def test_states_and_index_entries_per_version(harness):
    assert harness.dispatcher.models.state_of("lazy")[0] == "unavailable"  # no worker yet
    harness.ready_with(0, 1, {1: "unloaded", 2: "ready"})
    models = harness.dispatcher.models

    entries = models.index_entries("lazy", None)
    assert [(e["version"], e["state"], e["model_state"]) for e in entries] == [
        ("1", "READY", "unloaded"), ("2", "READY", "ready")]
    assert entries[1]["memory_bytes"] == 1_000_000 and entries[0]["reason"].startswith("not in memory")
    assert [e["state"] for e in models.index_entries("lazy", "unloaded through the API")] == ["UNAVAILABLE"] * 2
    assert models.index_entries("gone", None)[0]["model_state"] == "failed"
    assert models.index_entries("unknown", None) is None

    harness.dispatcher.recovery.quarantine("lazy/1", "3 crashes while loading")
    assert models.state_of("lazy/1") == ("quarantined", "model 'lazy/1' is quarantined: 3 crashes while loading")


def test_the_repository_api_unloads_everywhere_and_loads_failed_and_eager_versions_again(segment, loop):
    h = LifecycleHarness(segment, loop, dispatch_settings(), model_load_policy="eager")
    h.ready_with(0, 1, {1: "failed", 2: "ready"})

    h.dispatcher.models.unload("lazy")
    assert [(type(m), m.version) for _, m in h.port.loader] == [(Unload, 1), (Unload, 2)]
    h.model_state(0, 1, 2, "unloaded", cause="api")
    assert h.sample("ringserve_model_unloads_total", model="lazy", version="2", reason="api") == 1

    h.dispatcher.models.load("lazy")
    assert h.port.loads() == [("c0.g1", "lazy", 1), ("c0.g1", "lazy", 2)]


def test_unservable_names_failed_configs_and_failed_loads_until_they_load(harness):
    harness.ready_with(0, 1, {1: "unloaded", 2: "unloaded"})
    assert harness.dispatcher.models.unservable() == {"gone": "unreadable"}  # lazy and unloaded: servable
    harness.model_state(0, 1, 1, "failed", "InvalidProtobuf")
    assert harness.dispatcher.models.unservable() == {"gone": "unreadable", "lazy/1": "InvalidProtobuf"}
    harness.model_state(0, 1, 1, "ready", cause="api", loaded=True)
    assert harness.dispatcher.models.unservable() == {"gone": "unreadable"}


def test_a_model_whose_config_cannot_be_built_answers_503_without_retry_after(harness):
    catalog = harness.dispatcher.catalog
    for check in (lambda: catalog.check_failed("gone"), lambda: catalog.version(harness.v2, "7")):
        catalog.failed_configs["lazy/7"] = "unreadable"
        with pytest.raises(Unavailable, match="unreadable") as refused:
            check()
        assert refused.value.headers == {}
