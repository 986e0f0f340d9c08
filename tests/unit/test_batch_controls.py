"""The dynamic batcher's controls, one small test each, through a real Dispatcher.

The Dispatcher runs on a real asyncio loop over a real small shm segment; its WorkerPort
is faked (it records each BATCH) and the worker is simulated by writing outputs
into the slot as worker/loop.py does. A second model, `blocker`, keeps the one worker
busy (one batch in flight per worker) so requests can pile up in the queue under test.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import orjson
import pytest

from ringserve.common import wire
from ringserve.common.repository.batching import DynamicBatching, Padding, QueuePolicy
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.request import InferRequest
from ringserve.common.messages import Ready, Result
from ringserve.gateway.batching.deadlines import DEADLINE_HEAP_SLACK, TIMER_SLACK_S
from ringserve.gateway.dispatch.dispatcher import Dispatcher
from ringserve.gateway.core.errors import BadRequest, ClientDisconnected, DeadlineExceeded, Unavailable, status_of
from ringserve.gateway.observe.metrics import Metrics
from ringserve.gateway.batching.sizing import LatencyTargetSizer
from ringserve.shm.layout import pack_offsets
from ringserve.shm.segment import Segment

from tests.support.gateway_fakes import FakePort, Sent, dispatch_settings

SLOT_COUNT = 4
PROVIDER = "CPUExecutionProvider"
LONG_DELAY_US = 60_000_000  # a partial batch waits a minute: only a size flush sends it
DELAY_S = 0.02  # timer-driven tests: short, so the suite stays fast
LATE_S = 0.5  # how late a timer may fire on a loaded machine and still count as "at the deadline"


def model_config(name: str = "mlp", *, max_batch_size: int = 4, x_dims: tuple[int, ...] = (4,),
                 y_dims: tuple[int, ...] = (4,), mask_dims: tuple[int, ...] | None = None,
                 **batching) -> ModelConfig:
    """A model with input x (and optionally mask) and output y; `batching` are DynamicBatching fields."""
    inputs = [TensorConfig("x", "FP32", x_dims)]
    if mask_dims is not None:
        inputs.append(TensorConfig("mask", "INT64", mask_dims))
    return ModelConfig(name=name, max_batch_size=max_batch_size, inputs=tuple(inputs),
                       outputs=(TensorConfig("y", "FP32", y_dims),), dynamic_batching=DynamicBatching(**batching),
                       version=1, model_path=f"/models/{name}/1/model.onnx")


# Unbatched by the dynamic batcher: one request, one batch, sent at once.
BLOCKER = ModelConfig(name="blocker", max_batch_size=1, inputs=(TensorConfig("x", "FP32", (4,)),),
                      outputs=(TensorConfig("y", "FP32", (4,)),), dynamic_batching=None, version=1,
                      model_path="/models/blocker/1/model.onnx")


class Harness:
    """A Dispatcher serving `configs` (plus BLOCKER) to one simulated worker, through a fake port."""

    def __init__(self, segment: Segment, loop: asyncio.AbstractEventLoop, *configs: ModelConfig, **settings) -> None:
        settings.setdefault("max_inflight_per_worker", 1)
        self.segment, self.loop = segment, loop
        self.configs = {c.name: c for c in (*configs, BLOCKER)}
        self.metrics = Metrics()
        self.dispatcher = Dispatcher(segment=segment, configs=self.configs, runtime_dir="/nonexistent",
                                     metrics=self.metrics, settings=dispatch_settings(**settings))
        self.port = FakePort()
        self.dispatcher.attach(loop, self.port)
        self.sent = self.port.sent

    def batches(self, model: str = "mlp") -> list[Sent]:
        return [s for s in self.sent if s.batch.model == model]

    # -- the worker -------------------------------------------------------------------------
    def ready(self, index: int = 0, generation: int = 1) -> None:
        self.dispatcher.on_worker_message(index, generation, Ready(
            worker_index=index, generation=generation, pid=1000 + generation, models=dict.fromkeys(self.configs, PROVIDER)))

    def inputs_of(self, sent: Sent) -> dict[str, np.ndarray]:
        """The batch's input tensors as the worker would read them from the slot."""
        refs = [wire.TensorRef.from_wire(item) for item in sent.batch.inputs]
        return {ref.name: self.segment.tensor(sent.batch.slot_index, ref.offset,
                                              self.configs[sent.batch.model].input(ref.name).np_dtype,
                                              ref.shape).copy()
                for ref in refs}

    def answer(self, sent: Sent, model: Callable[[dict], dict] = lambda inputs: {"y": 2 * inputs["x"] + 1}) -> None:
        """Run `model` on the slot's inputs: outputs into the slot, output_generation last, then RESULT."""
        outputs = {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in model(self.inputs_of(sent)).items()}
        slot = sent.batch.slot_index
        offsets, _ = pack_offsets([a.nbytes for a in outputs.values()], sent.batch.output_offset)
        refs = []
        for (name, array), offset in zip(outputs.items(), offsets):
            self.segment.tensor(slot, offset, np.float32, array.shape)[:] = array
            refs.append(wire.TensorRef(name, "FP32", array.shape, offset).to_wire())
        self.segment.set_output_generation(slot, sent.batch.generation)
        index, generation = wire.parse_worker_identity(sent.identity)
        self.dispatcher.on_worker_message(index, generation,
                                          Result(sent.batch.batch_id, sent.batch.attempt, refs, compute_s=0.001))
        settle(self.loop)

    def occupy(self) -> Sent:
        """Keep the worker busy with a blocker batch; requests queue behind it."""
        self.submit(self.request(BLOCKER, rows(1, -1.0)))
        return self.batches("blocker")[-1]

    # -- requests ---------------------------------------------------------------------------
    def request(self, config: ModelConfig, x, *, priority: int = 0, timeout_us: int = 0,
                disconnected: Callable[[], bool] | None = None) -> InferRequest:
        x = np.asarray(x, dtype=np.float32)
        return InferRequest(model=config, inputs={"x": x}, rows=x.shape[0], shape_key=(x.shape[1:],),
                            kserve_id=None, requested_outputs=None, fault=None, future=self.loop.create_future(),
                            priority=priority, timeout_us=timeout_us, disconnected=disconnected)

    def submit(self, request: InferRequest) -> InferRequest:
        self.dispatcher.submit(request)
        settle(self.loop)
        return request

    def pruned(self, model: str, reason: str) -> float | None:
        return self.metrics.registry.get_sample_value("ringserve_requests_pruned_total",
                                                      {"model": model, "version": "1", "reason": reason})


def settle(loop: asyncio.AbstractEventLoop) -> None:
    """Run the loop one step, as it would after a request or a reply: the dispatcher pumps then."""
    loop.run_until_complete(asyncio.sleep(0))


def rows(n: int, first: float, width: int = 4) -> np.ndarray:
    """n rows of `width` values first, first + 1, ...: each request is recognisable in the slot."""
    return np.arange(n * width, dtype=np.float32).reshape(n, width) + first


def seq(length: int, first: float = 1.0) -> np.ndarray:
    """One row of a variable-length input."""
    return rows(1, first, width=length)


def stacked(*requests: InferRequest) -> np.ndarray:
    return np.concatenate([r.inputs["x"] for r in requests])


def result_of(request: InferRequest) -> np.ndarray:
    assert request.future.done()
    return request.future.result()["y"]


def answered_at(request: InferRequest) -> list[float]:
    """Filled with time.monotonic() when the request's future resolves."""
    times: list[float] = []
    request.future.add_done_callback(lambda _: times.append(time.monotonic()))
    return times


def poll_for(loop: asyncio.AbstractEventLoop, predicate: Callable[[], bool], timeout_s: float = 2.0) -> None:
    """Run the loop (its timers included) until `predicate` holds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not true within {timeout_s} s"
        loop.run_until_complete(asyncio.sleep(0.001))




# -- size flush ----------------------------------------------------------------------------------
def test_size_flush_sends_as_soon_as_max_batch_size_rows_are_queued(segment, loop):
    config = model_config(max_batch_size=4, max_queue_delay_us=LONG_DELAY_US)
    h = Harness(segment, loop, config)
    h.ready()
    a = h.submit(h.request(config, rows(1, 0.0)))
    b = h.submit(h.request(config, rows(2, 100.0)))
    assert h.sent == []  # 3 of 4 rows: waiting

    c = h.submit(h.request(config, rows(1, 200.0)))

    (sent,) = h.sent
    assert np.array_equal(h.inputs_of(sent)["x"], stacked(a, b, c))


# -- time flush ----------------------------------------------------------------------------------
def test_time_flush_sends_a_partial_batch_when_the_queue_delay_timer_fires(segment, loop):
    config = model_config(max_batch_size=4, max_queue_delay_us=int(DELAY_S * 1e6))
    h = Harness(segment, loop, config)
    h.ready()

    a = h.submit(h.request(config, rows(1, 0.0)))
    assert h.sent == []

    loop.run_until_complete(asyncio.sleep(DELAY_S))  # nothing but the loop's own timers runs
    poll_for(loop, lambda: bool(h.sent))

    (sent,) = h.sent
    assert a.enqueued_at + DELAY_S <= sent.at < a.enqueued_at + DELAY_S + LATE_S
    assert np.array_equal(h.inputs_of(sent)["x"], a.inputs["x"])


# -- preferred batch sizes -------------------------------------------------------------------------
def test_with_6_queued_and_preferred_4_and_8_a_batch_of_4_goes(segment, loop):
    config = model_config(max_batch_size=8, preferred_batch_size=(4, 8))
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    reqs = [h.submit(h.request(config, rows(1, 10.0 * i))) for i in range(6)]

    h.answer(blocker)

    (first,) = h.batches()
    assert np.array_equal(h.inputs_of(first)["x"], stacked(*reqs[:4]))
    h.answer(first)
    second = h.batches()[1]
    assert np.array_equal(h.inputs_of(second)["x"], stacked(*reqs[4:]))


def test_with_a_queue_delay_a_batch_goes_as_soon_as_a_preferred_size_is_reached(segment, loop):
    # Triton: "if the dynamic batcher can form a batch of a preferred size it will create a batch
    # of the largest possible preferred size"; below every preferred size it waits up to the delay.
    config = model_config(max_batch_size=8, preferred_batch_size=(4, 8), max_queue_delay_us=LONG_DELAY_US)
    h = Harness(segment, loop, config)
    h.ready()
    reqs = [h.submit(h.request(config, rows(1, 10.0 * i))) for i in range(3)]
    assert h.sent == []

    reqs.append(h.submit(h.request(config, rows(1, 30.0))))

    (sent,) = h.sent
    assert np.array_equal(h.inputs_of(sent)["x"], stacked(*reqs))


# -- priority ----------------------------------------------------------------------------------
def test_a_higher_priority_request_submitted_later_goes_first_in_the_next_batch(segment, loop):
    config = model_config(max_batch_size=2, priority_levels=2, default_priority_level=2)
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    low = h.submit(h.request(config, rows(1, 0.0), priority=2))
    default = h.submit(h.request(config, rows(1, 100.0)))  # priority 0: the model's default level, 2
    high = h.submit(h.request(config, rows(1, 200.0), priority=1))

    h.answer(blocker)

    (first,) = h.batches()
    assert np.array_equal(h.inputs_of(first)["x"], stacked(high, low))
    h.answer(first)
    assert np.array_equal(h.inputs_of(h.batches()[1])["x"], stacked(default))


def test_a_higher_priority_request_goes_first_even_when_it_cannot_share_the_batch(segment, loop):
    config = model_config(max_batch_size=4, x_dims=(-1,), priority_levels=2, default_priority_level=2)
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    low = h.submit(h.request(config, seq(3), priority=2))
    high = h.submit(h.request(config, seq(5), priority=1))  # another shape: another group

    h.answer(blocker)

    (first,) = h.batches()
    assert np.array_equal(h.inputs_of(first)["x"], high.inputs["x"])
    h.answer(first)
    assert np.array_equal(h.inputs_of(h.batches()[1])["x"], low.inputs["x"])


def infer_body(x: np.ndarray, **parameters) -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                     "data": x.ravel().tolist()}], "parameters": parameters})


def test_a_priority_parameter_beyond_the_levels_is_400(loop):
    config = model_config(max_batch_size=4, priority_levels=2, default_priority_level=1)

    with pytest.raises(BadRequest, match="parameters.priority 3 is out of range") as info:
        parse_infer_request(config, infer_body(rows(1, 0.0), priority=3), capacity_bytes=1 << 20,
                            future=loop.create_future(), allow_faults=False)

    assert status_of(info.value) == 400


def test_priority_and_timeout_parameters_are_read_from_the_request(loop):
    config = model_config(max_batch_size=4, priority_levels=2, default_priority_level=1)

    request = parse_infer_request(config, infer_body(rows(1, 0.0), priority=2, timeout=5000),
                                  capacity_bytes=1 << 20, future=loop.create_future(), allow_faults=False)

    assert (request.priority, request.timeout_us) == (2, 5000)


# -- queue full ---------------------------------------------------------------------------------
def test_a_full_priority_level_is_503_exceeds_maximum_queue_size_and_other_levels_still_queue(segment, loop):
    config = model_config(max_batch_size=8, max_queue_delay_us=LONG_DELAY_US, priority_levels=2,
                          default_priority_level=2, default_queue_policy=QueuePolicy(max_queue_size=2))
    h = Harness(segment, loop, config)
    h.ready()
    for i in range(2):
        h.submit(h.request(config, rows(1, i), priority=1))
    refused = h.request(config, rows(1, 2.0), priority=1)

    with pytest.raises(Unavailable, match="Exceeds maximum queue size") as info:
        h.dispatcher.submit(refused)

    assert status_of(info.value) == 503
    assert info.value.headers == {"retry-after": "1"}
    assert not refused.future.done()
    for i in range(2):  # max_queue_size counts per priority level
        h.submit(h.request(config, rows(1, 10.0 + i), priority=2))
    assert h.dispatcher.queues["mlp"].depth == 4
    assert h.sent == []


# -- timeouts ----------------------------------------------------------------------------------
def test_reject_answers_504_at_the_deadline_while_nothing_else_happens(segment, loop):
    config = model_config(default_queue_policy=QueuePolicy(default_timeout_us=int(DELAY_S * 1e6)))
    h = Harness(segment, loop, config)
    h.ready()
    h.occupy()  # never answered: no worker will take the request
    request = h.submit(h.request(config, rows(1, 0.0)))
    times = answered_at(request)

    poll_for(loop, lambda: bool(times))

    assert request.enqueued_at + DELAY_S <= times[0] < request.enqueued_at + DELAY_S + LATE_S
    with pytest.raises(DeadlineExceeded, match="Request timeout expired") as info:
        request.future.result()
    assert status_of(info.value) == 504
    assert h.dispatcher.queues["mlp"].depth == 0
    assert h.batches() == []


def delay_config(max_batch_size: int = 2, **more) -> ModelConfig:
    policy = QueuePolicy(timeout_action="DELAY", default_timeout_us=int(DELAY_S * 1e6))
    return model_config(max_batch_size=max_batch_size, default_queue_policy=policy, **more)


def wait_until_delayed(h: Harness, request: InferRequest) -> None:
    group = h.dispatcher.queues[request.model.name].groups[0][request.group]
    poll_for(h.loop, lambda: request in group.delayed)


def test_an_expired_delay_request_goes_after_unexpired_ones_that_arrived_later(segment, loop):
    config = delay_config(max_batch_size=2)
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    expired = h.submit(h.request(config, rows(1, 0.0)))
    wait_until_delayed(h, expired)  # by its timer
    later = [h.submit(h.request(config, rows(1, 100.0 * (i + 1)))) for i in range(2)]

    h.answer(blocker)

    (first,) = h.batches()
    assert np.array_equal(h.inputs_of(first)["x"], stacked(*later))
    h.answer(first)
    second = h.batches()[1]
    assert np.array_equal(h.inputs_of(second)["x"], stacked(expired))
    h.answer(second)
    assert np.array_equal(result_of(expired), 2 * expired.inputs["x"] + 1)  # delayed, not rejected


def test_a_delayed_request_still_gets_504_at_the_server_request_timeout(segment, loop):
    request_timeout_s = 0.1
    config = delay_config()
    h = Harness(segment, loop, config, request_timeout_s=request_timeout_s)
    h.ready()
    h.occupy()  # never answered
    request = h.submit(h.request(config, rows(1, 0.0)))
    times = answered_at(request)
    wait_until_delayed(h, request)
    assert not request.future.done()

    poll_for(loop, lambda: bool(times))

    assert times[0] >= request.enqueued_at + request_timeout_s
    with pytest.raises(DeadlineExceeded, match="Request timeout expired"):
        request.future.result()


def test_an_expired_delay_request_goes_after_an_unexpired_one_of_another_shape(segment, loop):
    config = delay_config(max_batch_size=4, x_dims=(-1,))
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    expired = h.submit(h.request(config, seq(3)))
    wait_until_delayed(h, expired)
    unexpired = h.submit(h.request(config, seq(5)))

    h.answer(blocker)

    (first,) = h.batches()
    assert np.array_equal(h.inputs_of(first)["x"], unexpired.inputs["x"])


def test_a_delay_request_past_its_policy_deadline_is_still_served_when_its_timer_has_not_run(segment, loop):
    config = delay_config()
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    request = h.submit(h.request(config, rows(1, 0.0)))
    time.sleep(2 * DELAY_S)  # the loop is busy elsewhere: the request's expiry timer has not run

    h.answer(blocker)

    if request.future.done():
        request.future.result()  # pruned as a ghost: DeadlineExceeded
    (sent,) = h.batches()
    h.answer(sent)
    assert np.array_equal(result_of(request), 2 * request.inputs["x"] + 1)


# -- timeout override ----------------------------------------------------------------------------
@pytest.mark.parametrize(("allow", "default_us", "request_us", "expected_s"), [
    (True, 200_000, 20_000, 0.02),  # lower: takes effect
    (True, 200_000, 1_000_000, 0.2),  # higher: ignored
    (False, 200_000, 20_000, 0.2),  # overriding not allowed: ignored
    (True, 0, 20_000, 0.02),  # no default timeout: any request timeout lowers "none"
    (True, 200_000, 0, 0.2),  # no request timeout: the default
], ids=["lower", "higher", "not-allowed", "no-default", "no-request-timeout"])
def test_a_request_timeout_may_only_lower_the_default(segment, loop, allow, default_us, request_us, expected_s):
    policy = QueuePolicy(default_timeout_us=default_us, allow_timeout_override=allow)
    config = model_config(default_queue_policy=policy)
    h = Harness(segment, loop, config)
    h.ready()
    h.occupy()

    request = h.submit(h.request(config, rows(1, 0.0), timeout_us=request_us))

    assert request.deadline - request.enqueued_at == pytest.approx(expected_s, abs=1e-6)


def test_a_lowered_request_timeout_fires_on_the_loop_timer(segment, loop):
    policy = QueuePolicy(default_timeout_us=10_000_000, allow_timeout_override=True)
    config = model_config(default_queue_policy=policy)
    h = Harness(segment, loop, config)
    h.ready()
    h.occupy()
    request = h.submit(h.request(config, rows(1, 0.0), timeout_us=int(DELAY_S * 1e6)))
    times = answered_at(request)

    poll_for(loop, lambda: bool(times))

    assert request.enqueued_at + DELAY_S <= times[0] < request.enqueued_at + DELAY_S + LATE_S
    with pytest.raises(DeadlineExceeded):
        request.future.result()


def test_deadlines_out_of_arrival_order_each_fire_and_answered_ones_do_not_pile_up(segment, loop):
    """Later requests with shorter timeouts expire first; one heap and one timer per queue serve
    them all, and the entries of answered requests are dropped rather than kept until they expire."""
    policy = QueuePolicy(default_timeout_us=10_000_000, allow_timeout_override=True)
    config = model_config(max_batch_size=1000, default_queue_policy=policy)
    h = Harness(segment, loop, config)
    h.ready()
    h.occupy()  # nothing is sent: every request waits for its deadline
    requests = [h.submit(h.request(config, rows(1, float(i)), timeout_us=int((6 - i) * DELAY_S * 1e6)))
                for i in range(5)]  # the last one submitted has the earliest deadline
    times = {id(r): answered_at(r) for r in requests}

    poll_for(loop, lambda: all(times[id(r)] for r in requests))

    for request in requests:
        assert request.deadline - TIMER_SLACK_S <= times[id(request)][0] < request.deadline + LATE_S
        with pytest.raises(DeadlineExceeded):
            request.future.result()
    order = sorted(requests, key=lambda r: times[id(r)][0])
    assert order == requests[::-1]
    queue = h.dispatcher.queues[config.key]
    assert queue.deadlines == [] and queue.deadline_timer is None

    # Requests with the default timeout need no entry (their lane's head is the earliest); lowered
    # ones answered long before their deadlines are dropped once they outnumber the waiting ones.
    other = model_config("busy", max_batch_size=4, default_queue_policy=policy)
    h2 = Harness(segment, loop, other)
    h2.ready()
    h2.submit(h2.request(other, rows(1, 0.0)))
    assert h2.dispatcher.queues[other.key].deadlines == [] and h2.dispatcher.queues[other.key].deadline_timer
    for i in range(3 * DEADLINE_HEAP_SLACK):
        h2.submit(h2.request(other, rows(1, float(i)), timeout_us=5_000_000))
        h2.answer(h2.sent[-1])
    assert 0 < len(h2.dispatcher.queues[other.key].deadlines) <= DEADLINE_HEAP_SLACK + 1


# -- ghost requests ----------------------------------------------------------------------------
def test_ghost_requests_never_reach_a_worker_and_are_counted(segment, loop):
    config = model_config(default_queue_policy=QueuePolicy(allow_timeout_override=True))
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    gone = h.submit(h.request(config, rows(1, 0.0), disconnected=lambda: True))
    late = h.submit(h.request(config, rows(1, 100.0), timeout_us=int(DELAY_S * 1e6)))
    live = h.submit(h.request(config, rows(1, 200.0), disconnected=lambda: False))
    time.sleep(2 * DELAY_S)  # the loop is busy elsewhere: `late` is past its deadline, its timer has not run

    h.answer(blocker)

    (sent,) = h.batches()
    assert np.array_equal(h.inputs_of(sent)["x"], live.inputs["x"])  # only its row is in the slot
    with pytest.raises(ClientDisconnected) as info:
        gone.future.result()
    assert status_of(info.value) == 499
    with pytest.raises(DeadlineExceeded) as info:
        late.future.result()
    assert status_of(info.value) == 504
    assert h.pruned("mlp", "disconnected") == 1
    assert h.pruned("mlp", "deadline") == 1
    h.answer(sent)
    assert np.array_equal(result_of(live), 2 * live.inputs["x"] + 1)


def test_a_queue_of_only_ghosts_sends_nothing_and_keeps_no_slot(segment, loop):
    config = model_config()
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    ghosts = [h.submit(h.request(config, rows(1, 10.0 * i), disconnected=lambda: True)) for i in range(3)]

    h.answer(blocker)

    assert h.batches() == []
    assert all(isinstance(g.future.exception(), ClientDisconnected) for g in ghosts)
    assert h.dispatcher.ring.free_count == SLOT_COUNT
    assert h.dispatcher.queues["mlp"].depth == 0
    assert h.pruned("mlp", "disconnected") == 3


# -- length buckets ------------------------------------------------------------------------------
def encoder_config(**batching) -> ModelConfig:
    return model_config(max_batch_size=4, x_dims=(-1,), y_dims=(-1,), padding=Padding(), **batching)


def test_buckets_batch_lengths_of_one_bucket_together_and_never_mix_buckets(segment, loop):
    config = encoder_config(sequence_buckets=(16, 32))
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    ten = h.submit(h.request(config, seq(10)))
    twenty = h.submit(h.request(config, seq(20)))
    twelve = h.submit(h.request(config, seq(12)))

    h.answer(blocker)

    (first,) = h.batches()
    x = h.inputs_of(first)["x"]
    assert x.shape == (2, 12)  # 10 and 12 share bucket 16, padded to 12
    assert np.array_equal(x[0, :10], ten.inputs["x"][0])
    assert np.array_equal(x[1], twelve.inputs["x"][0])
    h.answer(first)
    second = h.batches()[1]
    assert np.array_equal(h.inputs_of(second)["x"], twenty.inputs["x"])


def test_without_buckets_padded_lengths_share_one_batch(segment, loop):
    config = encoder_config()
    h = Harness(segment, loop, config)
    h.ready()
    blocker = h.occupy()
    reqs = [h.submit(h.request(config, seq(n))) for n in (10, 20, 12)]

    h.answer(blocker)

    (sent,) = h.batches()
    x = h.inputs_of(sent)["x"]
    assert x.shape == (3, 20)
    for row, r in enumerate(reqs):
        assert np.array_equal(x[row, :r.inputs["x"].shape[1]], r.inputs["x"][0])


# -- preserve_ordering ------------------------------------------------------------------------------
def test_preserve_ordering_answers_a_later_request_only_after_an_earlier_one(segment, loop):
    config = model_config(preserve_ordering=True)
    h = Harness(segment, loop, config, max_inflight_per_worker=2)
    h.ready()
    earlier = h.submit(h.request(config, rows(1, 0.0)))
    later = h.submit(h.request(config, rows(1, 100.0)))
    first, second = h.batches()  # two batches in flight at once
    order: list[str] = []
    earlier.future.add_done_callback(lambda _: order.append("earlier"))
    later.future.add_done_callback(lambda _: order.append("later"))

    h.answer(second)

    assert not later.future.done()  # finished, but waits for the earlier request
    h.answer(first)
    assert earlier.future.done() and later.future.done()
    loop.run_until_complete(asyncio.sleep(0))
    assert order == ["earlier", "later"]
    assert np.array_equal(result_of(later), 2 * later.inputs["x"] + 1)


def test_without_preserve_ordering_a_finished_request_is_answered_at_once(segment, loop):
    config = model_config()
    h = Harness(segment, loop, config, max_inflight_per_worker=2)
    h.ready()
    earlier = h.submit(h.request(config, rows(1, 0.0)))
    later = h.submit(h.request(config, rows(1, 100.0)))
    _, second = h.batches()

    h.answer(second)

    assert later.future.done() and not earlier.future.done()


# -- latency target ----------------------------------------------------------------------------------
def test_latency_target_shrinks_the_cap_multiplicatively_above_the_target():
    sizer = LatencyTargetSizer(target_s=0.010, max_rows=16)

    sizer.observe(0.020, rows=16)
    assert sizer.cap == 12
    sizer.observe(0.020, rows=12)
    assert sizer.cap == 9
    for _ in range(10):
        sizer.observe(1.0, rows=sizer.cap)
    assert sizer.cap == 1  # never below one row


def test_latency_target_grows_by_one_below_the_target_only_when_the_cap_was_the_limit():
    sizer = LatencyTargetSizer(target_s=0.010, max_rows=16)
    sizer.observe(0.020, rows=16)
    assert sizer.cap == 12

    sizer.observe(0.005, rows=3)  # a small batch under the target says nothing about bigger ones
    assert sizer.cap == 12
    sizer.observe(0.005, rows=12)
    assert sizer.cap == 13
    for _ in range(10):
        sizer.observe(0.005, rows=sizer.cap)
    assert sizer.cap == 16  # never above max_batch_size


def test_latency_target_grows_batches_when_latency_is_queueing_not_compute():
    # Over the target only because requests waited: smaller batches would drain the queue
    # slower (the collapse to batch 1 measured under contention); bigger ones drain it faster.
    sizer = LatencyTargetSizer(target_s=0.100, max_rows=16)
    sizer.cap = 8
    sizer.observe(0.800, rows=8, compute_s=0.010)
    assert sizer.cap == 9
    # Over the target with batches that alone take more than half of it: shrink.
    sizer.observe(0.200, rows=9, compute_s=0.080)
    assert sizer.cap == 6


def test_latency_target_caps_the_rows_of_a_batch(segment, loop):
    config = model_config(max_batch_size=8, latency_target_ms=10.0)
    h = Harness(segment, loop, config)
    h.ready()
    h.dispatcher.queues["mlp"].sizer.cap = 3
    blocker = h.occupy()
    reqs = [h.submit(h.request(config, rows(1, 10.0 * i))) for i in range(5)]

    h.answer(blocker)

    (sent,) = h.batches()
    assert np.array_equal(h.inputs_of(sent)["x"], stacked(*reqs[:3]))


# -- found while testing: the per-level groups and quarantine -------------------------------------
def test_quarantine_answers_every_queued_request_with_503(segment, loop):
    config = model_config(max_queue_delay_us=LONG_DELAY_US)
    h = Harness(segment, loop, config)
    h.ready()
    queued = h.submit(h.request(config, rows(1, 0.0)))

    h.dispatcher.recovery.quarantine("mlp", "3 of its requests crashed the worker")

    assert isinstance(queued.future.exception(), Unavailable)
    assert h.dispatcher.queues["mlp"].depth == 0
