"""One gateway among several, driven by hand with test_dispatch's Harness: ATTACH before any
BATCH, READYs from generations it should not use, stale RESULTs, executed batch sizes, and what it
tells the supervisor (WORKER_RETIRED with its index, QUARANTINE_MODEL)."""
from __future__ import annotations

import numpy as np
import pytest

from ringserve.common import messages
from ringserve.common.messages import Attach, Result
from ringserve.common.supervisor_messages import QuarantineModel, Snapshot, WorkerInfo, WorkerRetired, WorkerStarted
from ringserve.gateway.core.errors import Unavailable

from tests.support.gateway_fakes import dispatch_settings
from .test_dispatch import POISON, WIDE, Harness, result_of, rows

GATEWAY = 3  # this gateway's index


@pytest.fixture
def h(segment, loop):
    return Harness(segment, loop, dispatch_settings(gateway=GATEWAY, max_inflight_per_worker=1))


def sample(h: Harness, name: str, **labels: str) -> float | None:
    return h.metrics.registry.get_sample_value(name, labels or None)


def supervisor_got(h: Harness, kind: type) -> list:
    return [m for m in h.port.supervisor if isinstance(m, kind)]


def test_every_ready_is_answered_with_attach_naming_this_gateways_ring_before_any_batch(h):
    h.ready(0, 1)
    h.submit(rows(4, 0.0))

    assert h.port.order == [("ATTACH", b"w0.g1"), ("BATCH", b"w0.g1")]
    assert h.port.attached == [(b"w0.g1", Attach(gateway_index=GATEWAY, segment=h.segment.name))]


def test_a_worker_that_announces_itself_again_is_attached_again(h):
    h.ready(0, 1)
    h.ready(0, 1)  # it reconnected (this gateway restarted, say): it needs the ring again

    assert [identity for identity, _ in h.port.attached] == [b"w0.g1", b"w0.g1"]


def test_a_worker_heard_of_only_through_its_ready_and_the_snapshot_serves(h):
    """A restarted gateway never saw WORKER_STARTED: it learns the workers from READY and SNAPSHOT."""
    h.dispatcher.on_supervisor_event(Snapshot(supervisor_pid=1, workers=(WorkerInfo(worker_index=0, generation=2),)))
    h.ready(0, 2)
    request = h.submit(rows(4, 0.0))

    (sent,) = h.sent
    assert sent.identity == b"w0.g2"
    h.answer(sent)
    assert np.array_equal(result_of(request), 2 * request.inputs["x"] + 1)


def test_a_ready_from_a_generation_older_than_one_known_is_never_sent_batches_and_retired_at_once(h):
    h.ready(0, 2)
    h.ready(0, 1)  # a generation being replaced re-announces itself (this gateway restarted)
    h.submit(rows(4, 0.0))
    h.submit(rows(4, 100.0))

    assert supervisor_got(h, WorkerRetired) == [WorkerRetired(worker_index=0, generation=1, gateway_index=GATEWAY)]
    assert [s.identity for s in h.sent] == [b"w0.g2"]
    assert (b"w0.g1") not in [identity for identity, _ in h.port.attached]
    assert h.dispatcher.workers[0].generation == 2


def test_a_ready_older_than_a_started_generation_is_retired_too(h):
    h.dispatcher.on_supervisor_event(WorkerStarted(worker_index=0, pid=1002, generation=2))
    h.ready(0, 1)

    assert supervisor_got(h, WorkerRetired) == [WorkerRetired(worker_index=0, generation=1, gateway_index=GATEWAY)]
    with pytest.raises(Unavailable):
        h.dispatcher.check_available("mlp")


def test_a_newer_generation_takes_over_and_the_older_finishes_its_batch_before_it_is_retired(h):
    """No WORKER_STARTED came (this gateway restarted): the older one may still run its batch, on its slot."""
    h.ready(0, 1)
    a = h.submit(rows(4, 0.0))
    b = h.submit(rows(4, 100.0))
    (first,) = h.sent

    h.ready(0, 2)

    assert [s.identity for s in h.sent] == [b"w0.g1", b"w0.g2"]
    assert h.sent[1].batch.slot_index != first.batch.slot_index  # the older one's slot is still its own
    assert supervisor_got(h, WorkerRetired) == []
    h.answer(first)
    assert np.array_equal(result_of(a), 2 * a.inputs["x"] + 1)
    assert supervisor_got(h, WorkerRetired) == [WorkerRetired(worker_index=0, generation=1, gateway_index=GATEWAY)]
    h.answer(h.sent[1])
    assert np.array_equal(result_of(b), 2 * b.inputs["x"] + 1)


def test_batch_ids_start_at_a_random_62_bit_base(segment, loop, monkeypatch):
    monkeypatch.setattr("ringserve.gateway.dispatch.scheduler.secrets.randbits", lambda bits: 2**61 + 5 if bits == 62 else None)
    h = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=1))
    h.ready(0, 1)
    h.submit(rows(4, 0.0))

    assert h.sent[0].batch.batch_id == 2**61 + 5
    assert messages.decode(h.sent[0].batch.encode()) == h.sent[0].batch  # the wire carries it


def test_two_gateways_do_not_share_batch_ids(segment, loop):
    first = Harness(segment, loop, dispatch_settings())
    second = Harness(segment, loop, dispatch_settings())
    assert next(first.dispatcher.scheduler._batch_ids) != next(second.dispatcher.scheduler._batch_ids)


def test_a_result_for_a_batch_id_this_gateway_never_sent_is_ignored(h):
    h.ready(0, 1)
    request = h.submit(rows(4, 0.0))
    (sent,) = h.sent

    h.dispatcher.on_worker_message(0, 1, Result(batch_id=sent.batch.batch_id + 1000, attempt=0, outputs=[]))
    h.settle()

    assert not request.future.done()
    h.answer(sent)
    assert np.array_equal(result_of(request), 2 * request.inputs["x"] + 1)


def answer_as(h: Harness, sent, fused: int, execution_rows: int, compute_s: float = 0.004) -> None:
    """Answer like harness.answer, with the worker's fusion report."""
    real_result = h.result

    def result(sent, outputs, identity=None):
        h.reply(sent, Result(sent.batch.batch_id, sent.batch.attempt, outputs, compute_s=compute_s, fused=fused,
                             execution_rows=execution_rows), identity)
    h.result = result
    try:
        h.answer(sent)
    finally:
        h.result = real_result


def test_batch_size_and_compute_time_count_executions_as_the_worker_ran_them(segment, loop):
    h = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=3))
    h.ready(0, 1)
    for i in range(3):
        h.submit(rows(4, 100.0 * i))
    first, second, third = h.sent
    assert sample(h, "ringserve_batch_size_count", model="mlp", version="1") is None  # nothing observed when a batch forms

    answer_as(h, first, fused=2, execution_rows=9)  # it ran with another gateway's batch of 5 rows: 9 in all
    answer_as(h, second, fused=2, execution_rows=0)  # ran fused, reported by its execution's first batch
    answer_as(h, third, fused=1, execution_rows=0)  # ran alone; an unfused RESULT may not say its rows

    assert sample(h, "ringserve_batch_size_count", model="mlp", version="1") == 2
    assert sample(h, "ringserve_batch_size_sum", model="mlp", version="1") == 9 + 4
    assert sample(h, "ringserve_compute_seconds_count", model="mlp", version="1") == 2
    assert sample(h, "ringserve_fused_executions_total", model="mlp", version="1") == 1


def test_a_poison_quarantine_applies_here_at_once_and_goes_to_the_supervisor_for_every_gateway(segment, loop):
    h = Harness(segment, loop, dispatch_settings(gateway=GATEWAY, max_inflight_per_worker=1,
                                                 quarantine_poison_requests=1))
    poison = h.request(rows(1, 0.0), WIDE)  # (no batching delay: it goes at once)
    poison.inputs["x"][0, 0] = POISON
    h.isolate_as_poison(poison)

    assert poison.future.done()
    assert "wide" in h.dispatcher.quarantined
    counted, told = supervisor_got(h, QuarantineModel)
    assert counted == QuarantineModel("wide", "SIGSEGV", poison_request=True)  # counted across the gateways too
    assert told.model == "wide" and not told.poison_request and "crashed the worker on their own" in told.reason
    with pytest.raises(Unavailable, match="quarantined"):
        h.dispatcher.check_available("wide")


def test_a_restarted_gateway_waits_for_a_worker_before_it_accepts(h):
    assert not h.loop.run_until_complete(h.dispatcher.wait_for_a_worker(0.05))  # none yet: gives up

    h.loop.call_later(0.02, h.ready, 0, 1)
    assert h.loop.run_until_complete(h.dispatcher.wait_for_a_worker(5.0))


def test_a_gateway_stops_waiting_for_a_worker_when_it_is_told_to_stop(h):
    h.loop.call_later(0.02, setattr, h.dispatcher, "draining", True)
    assert not h.loop.run_until_complete(h.dispatcher.wait_for_a_worker(300.0))


def test_gateway_0_listens_at_once_at_the_servers_start_and_every_other_start_waits_for_a_worker():
    from ringserve.gateway.process import RESTART_WAIT_FOR_WORKER_S, START_WAIT_FOR_WORKER_S, wait_for_worker_s

    assert wait_for_worker_s(0, 0) == 0.0  # the health probe sees it live while the workers load
    assert wait_for_worker_s(1, 0) == START_WAIT_FOR_WORKER_S
    assert wait_for_worker_s(0, 3) == wait_for_worker_s(1, 1) == RESTART_WAIT_FOR_WORKER_S
