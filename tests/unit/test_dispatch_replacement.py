"""gateway/dispatch/dispatcher.py during a zero-downtime replacement: two generations of one worker index.

Driven by hand with test_dispatch's Harness: the supervisor's WORKER_STARTED(replaces=...)
and the workers' READY/RESULT messages are fed in, and the dispatcher's BATCH and
WORKER_RETIRED messages are recorded by the fake port.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ringserve.common.repository.scan import scan_repository
from ringserve.common.repository.demo import build_demo_models
from ringserve.common.supervisor_messages import Reload, ReloadWorkers, WorkerRetired, WorkerStarted

from tests.support.gateway_fakes import dispatch_settings
from .test_batch_controls import poll_for
from .test_dispatch import MODEL, PROVIDERS, SLOT_COUNT, Harness, result_of, rows


@pytest.fixture
def h(segment, loop):
    # One batch in flight per worker, so "the old one is busy" is unambiguous.
    return Harness(segment, loop, dispatch_settings(max_inflight_per_worker=1))


def started(h: Harness, index: int, generation: int, replaces: int | None, reason: str = "reload") -> None:
    h.dispatcher.on_supervisor_event(WorkerStarted(worker_index=index, pid=1000 + generation, generation=generation,
                                                   replaces=replaces, reason=reason if replaces is not None else None))


def retired(h: Harness) -> list[tuple[int, int]]:
    return [(m.worker_index, m.generation) for m in h.port.supervisor if isinstance(m, WorkerRetired)]


def test_the_old_generation_serves_until_its_successor_is_ready(h):
    h.ready(0, 1)
    started(h, 0, 2, replaces=1)

    request = h.submit(rows(4, 0.0))

    (sent,) = h.sent
    assert sent.identity == b"w0.g1"
    assert h.dispatcher.workers[0].generation == 1 and h.dispatcher.ready_workers()
    h.answer(sent)
    assert np.array_equal(result_of(request), 2 * request.inputs["x"] + 1)
    assert retired(h) == []


def test_on_ready_new_batches_go_to_the_successor_and_the_old_one_finishes_its_own(h):
    h.ready(0, 1)
    started(h, 0, 2, replaces=1)
    a = h.submit(rows(4, 0.0))
    b = h.submit(rows(4, 100.0))  # waits: generation 1 is busy with a
    (first,) = h.sent

    h.ready(0, 2)

    second = h.sent[1]
    assert (first.identity, second.identity) == (b"w0.g1", b"w0.g2")
    assert np.array_equal(h.inputs_of(second), b.inputs["x"])
    assert retired(h) == []  # generation 1 still holds a batch
    assert h.dispatcher.workers[0].generation == 2  # what /admin/status and the metrics show

    h.answer(first)  # the retiring worker's RESULT still counts

    assert np.array_equal(result_of(a), 2 * a.inputs["x"] + 1)
    assert retired(h) == [(0, 1)]
    c = h.submit(rows(4, 200.0))
    h.answer(second)
    assert h.sent[2].identity == b"w0.g2"  # never the retired one again
    h.answer(h.sent[2])
    assert np.array_equal(result_of(c), 2 * c.inputs["x"] + 1)
    assert h.dispatcher.ring.free_count == SLOT_COUNT


def test_an_idle_old_generation_is_retired_as_soon_as_the_successor_is_ready(h):
    h.ready(0, 1)
    started(h, 0, 2, replaces=1, reason="recycled")

    h.ready(0, 2)

    assert retired(h) == [(0, 1)]
    assert h.dispatcher.fleet.retiring == {}


def test_a_successor_that_dies_before_ready_leaves_the_old_one_serving(h):
    h.ready(0, 1)
    started(h, 0, 2, replaces=1)

    h.exited(0, 2, reason="exit_3")

    assert h.dispatcher.workers[0].state == "ready"
    assert h.dispatcher.fleet.successors == {}
    h.submit(rows(4, 0.0))
    assert h.sent[0].identity == b"w0.g1"
    assert retired(h) == []


def test_a_retiring_worker_that_dies_hands_its_batch_to_the_successor(h):
    h.ready(0, 1)
    started(h, 0, 2, replaces=1)
    a = h.submit(rows(4, 0.0))
    (first,) = h.sent
    h.ready(0, 2)

    h.exited(0, 1, reason="SIGSEGV")

    retry = h.sent[1]
    assert retry.identity == b"w0.g2"
    assert (retry.batch.batch_id, retry.batch.attempt) == (first.batch.batch_id, 1)
    assert h.dispatcher.workers[0].state == "ready"  # the death of the old one is not the index's
    h.answer(retry)
    assert np.array_equal(result_of(a), 2 * a.inputs["x"] + 1)


def test_the_old_generation_dying_first_lets_the_successor_take_over(h):
    h.ready(0, 1)
    started(h, 0, 2, replaces=1)
    a = h.submit(rows(4, 0.0))
    h.exited(0, 1, reason="SIGKILL")
    assert len(h.sent) == 1  # nobody is ready: it waits requeued

    h.ready(0, 2)

    retry = h.sent[1]
    assert (retry.identity, retry.batch.attempt) == (b"w0.g2", 1)
    assert retired(h) == [(0, 1)]  # harmless: the supervisor finds no such process any more
    h.answer(retry)
    assert np.array_equal(result_of(a), 2 * a.inputs["x"] + 1)


def test_reload_applies_the_repository_read_again_once_the_new_generation_serves(h, tmp_path: Path):
    build_demo_models(tmp_path)  # mlp (another config than the harness's), encoder (new); no `wide`
    d = h.dispatcher
    h.ready(0, 1)
    d.on_supervisor_event(Reload(model_repository=str(tmp_path)))
    started(h, 0, 2, replaces=1)

    h.ready(0, 2)
    poll_for(h.loop, lambda: set(d.catalog.configs) == {"mlp", "encoder"}, timeout_s=10.0)  # read off the loop, then applied

    assert d.catalog.configs["mlp"] != MODEL and d.queues["mlp"].config is d.catalog.configs["mlp"]
    assert "encoder" in d.queues


def test_a_reload_read_before_the_new_generation_serves_waits_for_it(h, tmp_path: Path):
    build_demo_models(tmp_path)
    catalog = h.dispatcher.catalog
    h.ready(0, 1)
    catalog.expect_reloaded_worker()  # as on RELOAD
    catalog.stage(scan_repository(tmp_path))  # the read finished first
    assert set(catalog.configs) == {"mlp", "wide"}  # not before the new generation serves

    started(h, 0, 2, replaces=1)
    h.ready(0, 2)

    assert set(catalog.configs) == {"mlp", "encoder"}
    assert catalog.queues["mlp"].config is catalog.configs["mlp"]


def test_a_successor_that_failed_a_model_the_old_generation_serves_is_stopped_and_the_old_one_serves_on(h):
    d = h.dispatcher
    h.ready(0, 1)
    started(h, 0, 2, replaces=1)
    held = h.submit(rows(4, 0.0))  # generation 1 runs it while the successor starts

    h.ready(0, 2, models={"wide": "CPUExecutionProvider"}, failed={"mlp": "INVALID_PROTOBUF"})

    assert retired(h) == [(0, 2)]  # the successor, not the serving generation
    assert d.workers[0].generation == 1 and d.workers[0].state == "ready"
    assert d.reload_status() == {"replacing": [], "kept_models": {"mlp": "INVALID_PROTOBUF"}}
    assert h.metrics.reload_failures.labels("mlp")._value.get() == 1
    h.answer(h.sent[0])
    later = h.submit(rows(4, 100.0))
    assert h.sent[1].identity == b"w0.g1"
    h.answer(h.sent[1])
    for request in (held, later):
        assert np.array_equal(result_of(request), 2 * request.inputs["x"] + 1)


def test_a_later_successor_that_serves_the_kept_model_again_takes_over(h):
    d = h.dispatcher
    h.ready(0, 1)
    started(h, 0, 2, replaces=1)
    h.ready(0, 2, failed={"mlp": "INVALID_PROTOBUF"})
    started(h, 0, 3, replaces=1)

    h.ready(0, 3)

    assert d.workers[0].generation == 3 and retired(h) == [(0, 2), (0, 1)]
    assert d.reload_status()["kept_models"] == {}


def test_a_successor_may_fail_a_model_the_old_generation_did_not_serve(h):
    h.ready(0, 1, models={"wide": "CPUExecutionProvider"}, failed={"mlp": "INVALID_PROTOBUF"})
    started(h, 0, 2, replaces=1)

    h.ready(0, 2, models={"wide": "CPUExecutionProvider"}, failed={"mlp": "still broken"})

    assert h.dispatcher.workers[0].generation == 2 and retired(h) == [(0, 1)]


def test_a_reload_keeps_the_config_of_a_served_model_whose_new_config_cannot_be_built(h, tmp_path: Path):
    build_demo_models(tmp_path)
    (tmp_path / "mlp" / "config.json").write_text("{not JSON")
    catalog = h.dispatcher.catalog
    catalog.expect_reloaded_worker()
    catalog.stage(scan_repository(tmp_path))

    catalog.reloaded_worker_serves()

    assert catalog.configs["mlp"] is MODEL and set(catalog.configs) == {"mlp", "encoder"}


def test_a_load_of_a_model_whose_config_failed_at_start_serves_it_from_new_workers(h):
    d = h.dispatcher
    d.catalog.failed_configs["late"] = "model.onnx cannot be read"
    h.ready(0, 1)
    late = replace(MODEL, name="late", model_path="/models/late/1/model.onnx")

    loading = h.loop.create_task(d.models.serve_fixed(late, wait_s=30.0))
    poll_for(h.loop, lambda: h.port.supervisor == [ReloadWorkers("late")])
    assert d.catalog.configs["late"] is late and "late" not in d.catalog.failed_configs
    started(h, 0, 2, replaces=1)
    h.ready(0, 2, models={**PROVIDERS, "late": "CPUExecutionProvider"})

    h.loop.run_until_complete(asyncio.wait_for(loading, 5))
    d.check_available("late")


def test_a_successor_whose_ready_comes_before_its_worker_started_retires_the_idle_old_generation(h):
    # A warm spare is ready in milliseconds: its READY may be read before the supervisor's WORKER_STARTED.
    h.ready(0, 1)
    h.ready(0, 2)

    started(h, 0, 2, replaces=1, reason="recycled")

    assert retired(h) == [(0, 1)]  # else the old process would run on, and the reload never end
    assert h.dispatcher.reload_status()["replacing"] == []
    request = h.submit(rows(4, 0.0))
    assert h.sent[-1].identity == b"w0.g2"
    h.answer(h.sent[-1])
    assert np.array_equal(result_of(request), 2 * request.inputs["x"] + 1)

