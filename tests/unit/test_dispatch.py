"""gateway/dispatch/dispatcher.py and its scheduler, driven by hand: a fake WorkerPort, a real slot ring, no sockets.

Workers are simulated by feeding the dispatcher the messages a worker or the supervisor
would send, and by writing outputs into the slot exactly as worker/loop.py does.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import orjson
import pytest

from ringserve.common import wire
from ringserve.common.repository.batching import DynamicBatching
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.messages import Error, Executed, Ready, Result
from ringserve.common.supervisor_messages import Unquarantine, WorkerExited
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.dispatch.dispatcher import Dispatcher
from ringserve.gateway.core.errors import ClientDisconnected, ModelExecutionFailed, Unavailable, WorkerCrashed, status_of
from ringserve.gateway.observe.metrics import Metrics
from ringserve.gateway.observe.stats import Statistics
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.shm.layout import pack_offsets
from ringserve.shm.segment import Segment

from tests.support.gateway_fakes import FakePort, Sent, dispatch_settings

SLOT_COUNT = 4
POISON = 666.0  # a row holding this value kills the (simulated) worker
BAD = -1.0  # a row holding this value makes the (simulated) model raise

# Batches of up to 4 rows; a partial batch waits a minute, so only a full one is sent at once.
MODEL = ModelConfig(
    name="mlp", max_batch_size=4,
    inputs=(TensorConfig("x", "FP32", (4,)),), outputs=(TensorConfig("y", "FP32", (4,)),),
    dynamic_batching=DynamicBatching(max_queue_delay_us=60_000_000), version=1,
    model_path="/models/mlp/1/model.onnx",
)
# No batching delay and room for many rows, to fill a slot with one request.
WIDE = ModelConfig(
    name="wide", max_batch_size=1000,
    inputs=(TensorConfig("x", "FP32", (4,)),), outputs=(TensorConfig("y", "FP32", (4,)),),
    dynamic_batching=None, version=1, model_path="/models/wide/1/model.onnx",
)
PROVIDERS = {"mlp": "CPUExecutionProvider", "wide": "CPUExecutionProvider"}


class Harness:
    """A Dispatcher on a fake port, plus the messages of workers and of the supervisor."""

    def __init__(self, segment: Segment, loop: asyncio.AbstractEventLoop, settings: DispatchSettings,
                 configs: dict[str, ModelConfig] | None = None, statistics: Statistics | None = None) -> None:
        self.segment, self.loop = segment, loop
        self.metrics = Metrics()
        self.statistics = statistics
        self.dispatcher = Dispatcher(segment=segment, configs=configs or {"mlp": MODEL, "wide": WIDE},
                                     runtime_dir="/nonexistent", metrics=self.metrics, settings=settings,
                                     statistics=statistics)
        self.port = FakePort()
        self.dispatcher.attach(loop, self.port)
        self.metrics.attach(self.dispatcher.snapshot)

    @property
    def sent(self) -> list[Sent]:
        return self.port.sent

    # -- the supervisor and the workers --------------------------------------------------
    def ready(self, index: int, generation: int, models: dict | None = None, failed: dict | None = None) -> None:
        self.dispatcher.on_worker_message(index, generation, Ready(
            worker_index=index, generation=generation, pid=1000 + generation,
            models=PROVIDERS if models is None else models, failed_models=failed or {}))

    def exited(self, index: int, generation: int, reason: str = "SIGSEGV", loading_model: str | None = None) -> None:
        self.dispatcher.on_supervisor_event(WorkerExited(
            worker_index=index, pid=1000 + generation, generation=generation, reason=reason, at=0.0,
            restarts={reason: 1}, loading_model=loading_model))

    def inputs_of(self, sent: Sent) -> np.ndarray:
        (ref,) = [wire.TensorRef.from_wire(item) for item in sent.batch.inputs]
        return self.segment.tensor(sent.batch.slot_index, ref.offset, np.float32, ref.shape).copy()

    def answer(self, sent: Sent, model: Callable[[np.ndarray], np.ndarray] = lambda x: 2 * x + 1,
               identity: bytes | None = None) -> None:
        """Run `model` on the batch's rows as a worker would, and send its Result."""
        self.result(sent, self.run(sent, model), identity)

    def run(self, sent: Sent, model: Callable[[np.ndarray], np.ndarray] = lambda x: 2 * x + 1) -> list:
        """What a worker does before its Result: outputs first, output_generation last; the outputs' refs."""
        y = model(self.inputs_of(sent)).astype(np.float32)
        slot = sent.batch.slot_index
        (offset,), _ = pack_offsets([y.nbytes], sent.batch.output_offset)
        self.segment.tensor(slot, offset, np.float32, y.shape)[:] = y
        self.segment.set_output_generation(slot, sent.batch.generation)
        return [wire.TensorRef("y", "FP32", y.shape, offset).to_wire()]

    def reply(self, sent: Sent, message: Result | Error, identity: bytes | None = None) -> None:
        index, generation = wire.parse_worker_identity(identity or sent.identity)
        self.dispatcher.on_worker_message(index, generation, message)
        self.settle()

    def result(self, sent: Sent, outputs: list, identity: bytes | None = None) -> None:
        self.reply(sent, Result(sent.batch.batch_id, sent.batch.attempt, outputs, compute_s=0.001), identity)

    def error(self, sent: Sent, message: str, kind: str | None = None) -> None:
        self.reply(sent, Error(sent.batch.batch_id, sent.batch.attempt, message, kind))

    def isolate_as_poison(self, request: InferRequest, index: int = 0) -> None:
        """Submit `request` to a fresh worker `index` and let it kill that worker max_attempts (2) times:
        the dispatcher isolates it as a poison request."""
        self.ready(index, 1)
        self.dispatcher.submit(request)
        self.settle()
        for generation in (1, 2):
            self.exited(index, generation)
            self.ready(index, generation + 1)

    # -- requests ---------------------------------------------------------------------------
    def request(self, x, config: ModelConfig = MODEL) -> InferRequest:
        x = np.asarray(x, dtype=np.float32)
        return InferRequest(model=config, inputs={"x": x}, rows=x.shape[0], shape_key=(x.shape[1:],),
                            kserve_id=None, requested_outputs=None, fault=None, future=self.loop.create_future())

    def submit(self, x, config: ModelConfig = MODEL) -> InferRequest:
        request = self.request(x, config)
        self.dispatcher.submit(request)
        self.settle()
        return request

    def settle(self) -> None:
        """Run the loop one step, as it would after a request or a reply: the dispatcher pumps then."""
        settle(self.loop)


def settle(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0))


def rows(n: int, first: float) -> np.ndarray:
    """n rows of 4 values, first, first + 1, ...: each request's rows are recognisable in the slot."""
    return np.arange(n * 4, dtype=np.float32).reshape(n, 4) + first


def result_of(request: InferRequest) -> np.ndarray:
    assert request.future.done()
    return request.future.result()["y"]




@pytest.fixture
def harness(segment, loop):
    # One batch at a time per worker: the sends in these tests are easy to follow.
    return Harness(segment, loop, dispatch_settings(max_inflight_per_worker=1))


# -- availability ------------------------------------------------------------------------------
def test_no_worker_at_all_is_503_with_retry_after(segment, loop):
    h = Harness(segment, loop, dispatch_settings(retry_after_s=7))

    with pytest.raises(Unavailable) as info:
        h.dispatcher.check_available("mlp")

    assert status_of(info.value) == 503
    assert info.value.headers == {"retry-after": "7"}
    assert "workers are starting" in str(info.value)


def test_submit_while_no_worker_is_ready_is_refused_and_queues_nothing(harness):
    request = harness.request(rows(4, 0.0))

    with pytest.raises(Unavailable):
        harness.dispatcher.submit(request)

    assert harness.dispatcher.queues["mlp"].depth == 0
    assert harness.sent == []
    assert not request.future.done()


def test_with_a_hold_a_request_before_any_worker_was_heard_of_waits_for_the_first_ready(segment, loop):
    # (a gateway can be up before the workers' READY reaches it: with a hold its first requests wait, not 503)
    h = Harness(segment, loop, dispatch_settings(hold_when_unavailable_s=5.0))
    request = h.submit(rows(4, 1.0))  # a full batch: sent as soon as a worker is ready
    assert request.held and h.sent == []

    h.ready(0, 1)
    h.settle()
    (sent,) = h.sent
    h.answer(sent)
    np.testing.assert_array_equal(result_of(request), 2 * rows(4, 1.0) + 1)


def test_after_a_death_503_says_the_worker_is_restarting_and_why(harness):
    harness.ready(0, 1)
    harness.exited(0, 1, reason="SIGKILL (out of memory)")

    with pytest.raises(Unavailable, match=r"worker 0 is restarting after SIGKILL \(out of memory\)") as info:
        harness.dispatcher.check_available("mlp")
    assert info.value.headers == {"retry-after": "1"}


def test_model_that_failed_to_load_is_503_naming_the_load_error(harness):
    harness.ready(0, 1, models={"wide": "CPUExecutionProvider"}, failed={"mlp": "protobuf parsing failed"})

    with pytest.raises(Unavailable, match="failed to load \\(protobuf parsing failed\\)"):
        harness.dispatcher.check_available("mlp")
    harness.dispatcher.check_available("wide")  # the other model is served


# -- sending batches ------------------------------------------------------------------------------
def test_ready_worker_gets_a_batch_naming_the_slot_generation_and_rows(harness):
    harness.ready(0, 1)
    request = harness.submit(rows(4, 10.0))

    (sent,) = harness.sent
    assert sent.identity == b"w0.g1"
    assert (sent.batch.model, sent.batch.attempt) == ("mlp", 0)
    assert (sent.batch.slot_index, sent.batch.generation) == (0, 1)
    assert harness.segment.generation(0) == 1
    assert sent.batch.inputs == [["x", "FP32", [4, 4], 0]]
    assert sent.batch.output_offset == 64
    assert np.array_equal(harness.inputs_of(sent), request.inputs["x"])
    assert not request.future.done()


def test_a_partial_batch_waits_and_a_full_one_goes_at_once(harness):
    harness.ready(0, 1)
    a, b = harness.submit(rows(1, 0.0)), harness.submit(rows(2, 100.0))
    assert harness.sent == []  # 3 of 4 rows: the queue delay runs

    c = harness.submit(rows(1, 200.0))

    (sent,) = harness.sent
    assert sent.batch.inputs[0][2] == [4, 4]
    assert np.array_equal(harness.inputs_of(sent), np.concatenate([a.inputs["x"], b.inputs["x"], c.inputs["x"]]))


def test_result_resolves_each_future_with_its_own_rows_and_frees_the_slot(harness):
    harness.ready(0, 1)
    reqs = [harness.submit(rows(n, 100.0 * i)) for i, n in enumerate([1, 2, 1])]
    (sent,) = harness.sent

    harness.answer(sent)

    for r in reqs:
        assert np.array_equal(result_of(r), 2 * r.inputs["x"] + 1)
    assert harness.dispatcher.ring.free_count == SLOT_COUNT
    assert harness.dispatcher.scheduler.batches == {}
    assert harness.dispatcher.workers[0].in_flight == {}


def test_outputs_not_vouched_for_by_output_generation_are_not_read(harness):
    harness.ready(0, 1)
    request = harness.submit(rows(4, 0.0))
    (sent,) = harness.sent

    # A RESULT whose slot header does not carry the batch's generation (still 0 after acquire).
    harness.result(sent, [["y", "FP32", [4, 4], sent.batch.output_offset]])

    assert not request.future.done()
    resent = harness.sent[1]
    assert (resent.batch.batch_id, resent.batch.slot_index, resent.batch.attempt) == (
        sent.batch.batch_id, sent.batch.slot_index, 0)  # run again, not counted as a crash
    harness.answer(resent)
    assert np.array_equal(result_of(request), 2 * request.inputs["x"] + 1)


# -- worker deaths ------------------------------------------------------------------------------------
def test_batch_of_a_dead_worker_is_resent_first_to_the_next_generation_on_the_same_slot(harness):
    harness.ready(0, 1)
    a = harness.submit(rows(4, 0.0))
    b = harness.submit(rows(4, 100.0))  # queued behind a: the worker has one batch in flight
    (first,) = harness.sent

    harness.exited(0, 1)
    assert len(harness.sent) == 1  # nobody is ready
    harness.ready(0, 2)

    retry = harness.sent[1]
    assert retry.identity == b"w0.g2"
    assert retry.batch.batch_id == first.batch.batch_id
    assert retry.batch.attempt == 1
    assert (retry.batch.slot_index, retry.batch.generation) == (first.batch.slot_index, first.batch.generation)
    assert retry.batch.inputs == first.batch.inputs
    assert np.array_equal(harness.inputs_of(retry), a.inputs["x"])  # the slot was not rewritten
    assert harness.metrics.registry.get_sample_value("ringserve_batches_requeued_total", {"model": "mlp", "version": "1"}) == 1

    harness.answer(retry)

    assert np.array_equal(result_of(a), 2 * a.inputs["x"] + 1)
    then = harness.sent[2]
    assert then.batch.slot_index != retry.batch.slot_index
    assert np.array_equal(harness.inputs_of(then), b.inputs["x"])


def test_result_from_a_dead_generation_is_ignored(harness):
    harness.ready(0, 1)
    request = harness.submit(rows(4, 0.0))
    (first,) = harness.sent
    harness.exited(0, 1)
    harness.ready(0, 2)
    retry = harness.sent[1]

    # The old process's reply, delayed in the socket: same batch, attempt 0, identity w0.g1.
    harness.answer(first, model=lambda x: x * 0 - 5)

    # Nor does a reply from the dead process count if it names the current attempt.
    harness.answer(retry, model=lambda x: x * 0 - 5, identity=first.identity)

    assert not request.future.done()
    assert harness.dispatcher.ring.free_count == SLOT_COUNT - 1
    assert harness.dispatcher.workers[0].in_flight  # still waiting for generation 2

    harness.answer(retry)

    assert np.array_equal(result_of(request), 2 * request.inputs["x"] + 1)
    assert harness.dispatcher.ring.free_count == SLOT_COUNT


def test_a_poison_request_is_isolated_by_bisection_and_only_it_fails(harness):
    reqs = [harness.request(rows(1, 10.0 * i)) for i in range(4)]
    poison = reqs[2]
    poison.inputs["x"][0, 1] = POISON
    generation = 1
    harness.ready(0, generation)
    for r in reqs:
        harness.dispatcher.submit(r)
    harness.settle()  # one batch of all of them

    crashes = 0
    done = 0
    while done < len(harness.sent):
        sent = harness.sent[done]
        done += 1
        assert sent.identity == wire.worker_identity(0, generation)
        if (harness.inputs_of(sent) == POISON).any():
            crashes += 1
            harness.exited(0, generation, reason="SIGSEGV")
            generation += 1
            harness.ready(0, generation)
        else:
            harness.answer(sent)

    # 4 requests crash twice, then halves: [r0 r1] runs, [r2 r3] crashes, [r2] crashes, [r3] runs.
    assert [s.batch.inputs[0][2][0] for s in harness.sent] == [4, 4, 2, 2, 1, 1]
    assert [s.batch.attempt for s in harness.sent] == [0, 1, 1, 1, 1, 1]  # halves split after one more crash
    assert crashes == 4
    with pytest.raises(WorkerCrashed, match="SIGSEGV") as info:
        poison.future.result()
    assert status_of(info.value) == 500
    for r in reqs:
        if r is not poison:
            assert np.array_equal(result_of(r), 2 * r.inputs["x"] + 1)
    assert harness.dispatcher.ring.free_count == SLOT_COUNT
    assert harness.metrics.registry.get_sample_value("ringserve_poison_requests_total", {"model": "mlp", "version": "1"}) == 1


def test_an_error_reply_splits_the_batch_and_fails_only_the_bad_request(harness):
    reqs = [harness.request(x) for x in (rows(1, 0.0), rows(2, 100.0), rows(1, 200.0))]
    bad = reqs[1]
    bad.inputs["x"][1, 3] = BAD
    harness.ready(0, 1)
    for r in reqs:
        harness.dispatcher.submit(r)
    harness.settle()  # one batch of all of them

    done = 0
    while done < len(harness.sent):
        sent = harness.sent[done]
        done += 1
        if (harness.inputs_of(sent) == BAD).any():
            harness.error(sent, "Non-zero status code returned while running Gemm node")
        else:
            harness.answer(sent)

    # [r0 r1 r2] -> [r0] ok, [r1 r2] -> [r1] fails, [r2] ok; all on the same, living worker.
    assert [s.batch.inputs[0][2][0] for s in harness.sent] == [4, 1, 3, 2, 1]
    assert {s.identity for s in harness.sent} == {b"w0.g1"}
    with pytest.raises(ModelExecutionFailed, match="Gemm node") as info:
        bad.future.result()
    assert status_of(info.value) == 400
    for r in (reqs[0], reqs[2]):
        assert np.array_equal(result_of(r), 2 * r.inputs["x"] + 1)
    assert harness.dispatcher.ring.free_count == SLOT_COUNT


def test_an_unreachable_worker_gives_its_batch_back_without_counting_a_crash(harness):
    harness.ready(0, 1)
    harness.port.unreachable.add(b"w0.g1")

    request = harness.submit(rows(4, 0.0))

    assert harness.sent == []
    assert harness.dispatcher.workers[0].state == "dead"
    harness.ready(0, 2)
    (sent,) = harness.sent
    assert (sent.identity, sent.batch.attempt) == (b"w0.g2", 0)
    harness.answer(sent)
    assert np.array_equal(result_of(request), 2 * request.inputs["x"] + 1)


def test_a_request_that_passed_the_413_check_is_sent(harness):
    harness.ready(0, 1)
    capacity = harness.segment.data_capacity
    n = (capacity - 2 * 64) // (16 + 16)  # the most rows the 413 check lets through
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [n, 4], "data": [0.5] * (4 * n)}]})
    request = parse_infer_request(WIDE, body, capacity_bytes=capacity, future=harness.loop.create_future(),
                                  allow_faults=False)

    harness.dispatcher.submit(request)
    harness.settle()

    (sent,) = harness.sent
    assert sent.batch.inputs[0][2] == [n, 4]


def test_pipelining_keeps_two_batches_in_flight_per_worker_and_requeues_them_in_order(segment, loop):
    h = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=2))
    h.ready(0, 1)
    a = h.submit(rows(4, 0.0))
    b = h.submit(rows(4, 100.0))
    c = h.submit(rows(4, 200.0))
    assert [s.batch.slot_index for s in h.sent] == [0, 1]  # the third waits for room
    assert h.dispatcher.queues["mlp"].depth == 1

    h.exited(0, 1)
    h.ready(0, 2)
    resent = h.sent[2:]
    # Oldest first; only the oldest was running, so only it counts an attempt.
    assert [(s.batch.slot_index, s.batch.attempt) for s in resent] == [(0, 1), (1, 0)]
    for s in resent:
        h.answer(s)
    for r in (a, b):
        assert np.array_equal(result_of(r), 2 * r.inputs["x"] + 1)
    h.answer(h.sent[4])
    assert np.array_equal(result_of(c), 2 * c.inputs["x"] + 1)


def test_a_batch_whose_outputs_were_written_before_the_death_is_not_blamed_for_it(segment, loop):
    """The worker finished a and died running b before a's Result reached the gateway (it died with the
    worker, or waits unread behind the supervisor's news): b caused the death, not a."""
    h = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=2))
    h.ready(0, 1)
    a = h.submit(rows(4, 0.0))
    b = h.submit(rows(4, 100.0))
    first, second = h.sent
    h.run(first)  # its outputs, but no Result

    h.exited(0, 1)
    h.ready(0, 2)

    assert [(s.batch.batch_id, s.batch.attempt) for s in h.sent[2:]] == [
        (first.batch.batch_id, 0), (second.batch.batch_id, 1)]
    for s in h.sent[2:]:
        h.answer(s)
    for r in (a, b):
        assert np.array_equal(result_of(r), 2 * r.inputs["x"] + 1)


def test_a_worker_that_died_after_finishing_all_it_held_blames_the_newest(segment, loop):
    h = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=2))
    h.ready(0, 1)
    h.submit(rows(4, 0.0))
    h.submit(rows(4, 100.0))
    first, second = h.sent
    h.run(first)
    h.run(second)

    h.exited(0, 1)
    h.ready(0, 2)

    assert [(s.batch.batch_id, s.batch.attempt) for s in h.sent[2:]] == [
        (first.batch.batch_id, 0), (second.batch.batch_id, 1)]


def test_a_half_sent_after_its_other_half_answered_is_blamed_when_its_worker_dies(segment, loop):
    """Halves share a slot: the first's answer left the slot's output generation set. The second half,
    running when its worker died, must not read as finished (the batch behind it would be blamed)."""
    h = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=2))
    h.ready(0, 1)
    for r in (h.request(rows(2, 0.0)), h.request(rows(2, 100.0))):
        h.dispatcher.submit(r)
    h.settle()  # one full batch
    h.error(h.sent[0], "Non-zero status code returned while running Gemm node")  # split in halves
    h.answer(h.sent[1])  # the first half; the second goes into the same slot
    half = h.sent[2]
    assert (half.batch.slot_index, half.batch.generation) == (h.sent[0].batch.slot_index, h.sent[0].batch.generation)
    h.submit(rows(4, 200.0))
    behind = h.sent[3]

    h.exited(0, 1)
    h.ready(0, 2)

    assert [(s.batch.batch_id, s.batch.attempt) for s in h.sent[4:]] == [
        (half.batch.batch_id, 1), (behind.batch.batch_id, 0)]


def test_a_requeued_request_whose_deadline_passes_before_a_worker_returns_gets_504(segment, loop):
    h = Harness(segment, loop, dispatch_settings(request_timeout_s=0.1, max_inflight_per_worker=1))
    h.ready(0, 1)
    running = h.submit(rows(4, 0.0))
    h.exited(0, 1)  # its batch goes back to the queue; no worker is ready to take it
    assert not running.future.done()

    loop.run_until_complete(asyncio.sleep(0.3))  # the queue's deadline timer runs meanwhile

    assert running.future.done() and status_of(running.future.exception()) == 504
    assert h.dispatcher.queues["mlp"].deadline_timer is None  # nothing left to wait for: no timer armed
    h.ready(0, 2)
    assert len(h.sent) == 1  # the expired request is not run again


def test_requests_of_one_loop_step_share_a_batch_even_when_the_worker_has_room(harness):
    harness.ready(0, 1)
    requests = [harness.request(rows(1, 10.0 * i), WIDE) for i in range(3)]
    for request in requests:
        harness.dispatcher.submit(request)
    assert harness.sent == []  # the pump runs when this step of the loop ends, not per request

    harness.settle()

    (sent,) = harness.sent
    assert np.array_equal(harness.inputs_of(sent), np.concatenate([r.inputs["x"] for r in requests]))
    harness.answer(sent)
    assert all(np.array_equal(result_of(r), 2 * r.inputs["x"] + 1) for r in requests)


def test_halves_of_a_ragged_batch_are_written_again_with_their_own_elements_and_offsets(segment, loop, tmp_path):
    """A ragged input is an element range, and OFFSETS (a batch_input) is computed over the
    batch: a half can't be a view of the whole. Each half is written again when it is sent,
    and ONNX Runtime on what the worker would read gives each request its own answer."""
    import onnxruntime as ort

    from ringserve.common.repository.scan import load_model
    from tests.support.models import build_segment_sum

    build_segment_sum(tmp_path)
    config = load_model(tmp_path, "segsum")
    session = ort.InferenceSession(config.model_path, providers=["CPUExecutionProvider"])
    h = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=1),
                configs={"mlp": MODEL, "wide": WIDE, "segsum": config})
    h.ready(0, 1, models={**PROVIDERS, "segsum": "CPUExecutionProvider"})
    pieces = [np.arange(n, dtype=np.float32).reshape(1, n) + 10 * n for n in (3, 4, 5, 2)]
    requests = []
    for piece in pieces:
        request = InferRequest(model=config, inputs={"INPUT": piece}, rows=1, shape_key=(piece.shape[1:],),
                               kserve_id=None, requested_outputs=None, fault=None, future=loop.create_future())
        h.dispatcher.submit(request)
        requests.append(request)
    loop.run_until_complete(asyncio.sleep(0.1))  # its max_queue_delay (20 ms) passes: one batch of all four

    def run(sent: Sent) -> None:
        refs = [wire.TensorRef.from_wire(item) for item in sent.batch.inputs]
        feeds = {ref.name: h.segment.tensor(sent.batch.slot_index, ref.offset, config.input(ref.name).np_dtype
                                            if ref.name != "OFFSETS" else np.int32, ref.shape).copy() for ref in refs}
        y = session.run(None, feeds)[0]
        (offset,), _ = pack_offsets([y.nbytes], sent.batch.output_offset)
        h.segment.tensor(sent.batch.slot_index, offset, np.float32, y.shape)[:] = y
        h.segment.set_output_generation(sent.batch.slot_index, sent.batch.generation)
        h.result(sent, [wire.TensorRef("SUM", "FP32", y.shape, offset).to_wire()])

    (whole,) = h.sent
    h.error(whole, "the model refused this batch")  # bisect: one bad request must not fail the others
    while len(h.sent) > 1 and not all(r.future.done() for r in requests):
        run(h.sent.pop())

    for request, piece in zip(requests, pieces):
        assert float(request.future.result()["SUM"][0, 0]) == float(piece.sum())  # its own elements only
    assert h.dispatcher.ring.free_count == SLOT_COUNT


def test_a_batch_that_cannot_be_written_answers_its_requests_500_and_frees_its_slot(harness, monkeypatch):
    import ringserve.gateway.dispatch.scheduler as scheduler_module

    real = scheduler_module.write_batch

    def write_batch(segment, lease, requests):
        if any(r.inputs["x"][0, 0] == BAD for r in requests):
            raise IndexError("a bug")
        return real(segment, lease, requests)

    monkeypatch.setattr(scheduler_module, "write_batch", write_batch)
    harness.ready(0, 1)
    doomed = harness.submit(np.full((4, 4), BAD, np.float32))

    error = doomed.future.exception()
    assert status_of(error) == 500 and "could not write this request's batch" in str(error)
    assert "IndexError: a bug" in str(error) and harness.sent == []
    assert harness.dispatcher.ring.free_count == SLOT_COUNT
    fine = harness.submit(rows(4, 0.0))  # the next batch goes as usual
    harness.answer(harness.sent[0])
    assert np.array_equal(result_of(fine), 2 * fine.inputs["x"] + 1)


def test_a_repository_load_lifts_the_quarantine_here_and_at_the_supervisor(harness):
    harness.ready(0, 1)
    harness.dispatcher.recovery.quarantine("mlp", "3 of its requests crashed the worker")
    with pytest.raises(Unavailable, match="quarantined"):
        harness.dispatcher.check_available("mlp")

    assert harness.dispatcher.lift_quarantine("mlp")

    harness.dispatcher.check_available("mlp")
    assert harness.port.supervisor == [Unquarantine("mlp")]
    assert not harness.dispatcher.lift_quarantine("mlp")  # nothing left to lift: the supervisor is not told again
    assert harness.port.supervisor == [Unquarantine("mlp")]


# -- decoupled streams and cancellation (dispatch/replies.py) ----------------------------------------------
STREAMS = ModelConfig(
    name="streams", max_batch_size=4,
    inputs=(TensorConfig("x", "FP32", (4,)),), outputs=(TensorConfig("y", "FP32", (4,)),),
    dynamic_batching=None, version=1, model_path="/models/streams/1/model.py", platform="",
    extra={"backend": "python", "model_transaction_policy": {"decoupled": True}},
)


def streams_harness(segment, loop, **settings) -> Harness:
    h = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=1, **settings), {"streams": STREAMS})
    h.ready(0, 1, models={"streams": "python"})
    return h


def test_a_stream_past_its_execute_takes_no_turn_of_its_worker_but_keeps_its_slot(segment, loop):
    h = streams_harness(segment, loop)
    first = h.submit(rows(1, 0.0), STREAMS)
    h.submit(rows(1, 10.0), STREAMS)
    assert len(h.sent) == 1  # one batch at a time per worker

    h.reply(h.sent[0], Executed(h.sent[0].batch.batch_id, 0))
    assert len(h.sent) == 2  # the worker is free for the next batch
    assert h.dispatcher.ring.free_count == SLOT_COUNT - 2 and not first.done  # the stream still holds its slot

    h.exited(0, 1)  # the worker dies: only the batch it was running counts the crash
    assert [b.attempt for b in h.dispatcher.queues["streams"].requeued] == [0, 1]


def test_a_cancelled_request_of_a_running_python_batch_is_answered_at_once_and_its_worker_told(segment, loop):
    h = streams_harness(segment, loop)
    request = h.submit(rows(1, 0.0), STREAMS)
    sent = h.sent[0]

    h.dispatcher.cancel(request, ClientDisconnected())
    assert status_of(request.future.exception()) == 499
    (identity, cancel), = h.port.cancels
    assert identity == wire.courier_identity(0, 1)
    assert (cancel.batch_id, cancel.attempt, cancel.request_indexes) == (sent.batch.batch_id, 0, [0])
    assert h.dispatcher.ring.free_count == SLOT_COUNT - 1  # freed by the worker's RESULT only
    h.reply(sent, Result(sent.batch.batch_id, 0, [], answers=[[[], "the request was cancelled", 499]]))
    assert h.dispatcher.ring.free_count == SLOT_COUNT


def test_a_queued_request_cancelled_leaves_its_queue_and_tells_no_worker(segment, loop):
    h = streams_harness(segment, loop)
    h.submit(rows(1, 0.0), STREAMS)
    queued = h.submit(rows(1, 10.0), STREAMS)
    assert h.dispatcher.queues["streams"].depth == 1

    h.dispatcher.cancel(queued, ClientDisconnected())
    assert status_of(queued.future.exception()) == 499
    assert h.dispatcher.queues["streams"].depth == 0 and h.port.cancels == []


def test_a_stream_still_open_at_its_deadline_ends_with_504_and_its_model_is_told(segment, loop):
    h = streams_harness(segment, loop, request_timeout_s=0.05)
    request = h.submit(rows(1, 0.0), STREAMS)
    h.reply(h.sent[0], Executed(h.sent[0].batch.batch_id, 0))

    loop.run_until_complete(asyncio.sleep(0.1))
    assert status_of(request.future.exception()) == 504
    assert "not finished within" in str(request.future.exception())
    assert [c.request_indexes for _, c in h.port.cancels] == [[0]]
