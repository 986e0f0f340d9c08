"""gateway/batching/queues.py, slots.py, slot_outputs.py: size-or-deadline batching per shape, slot writes, output splits."""
from __future__ import annotations

import asyncio
import dataclasses
import itertools

import numpy as np
import orjson
import pytest

from ringserve.common.repository.batching import DynamicBatching

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.repository.reshape import SCATTER_WITH_INPUT_SHAPE, BatchOutput
from ringserve.common.wire import TensorRef
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.batching.slot_outputs import split_outputs
from ringserve.gateway.batching.slots import SlotBatch, SlotUse, write_batch
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.request import InferRequest
from ringserve.shm.layout import ALIGN_BYTES, PAGE_BYTES, pack_offsets
from ringserve.shm.ring import Ring, SlotLease

from .conftest import make_segment

BIG_SLOT_BYTES = 1 << 20


def model(max_batch_size: int = 4, delay_us: int = 0, x_dims: tuple[int, ...] = (4,),
          y_dims: tuple[int, ...] = (4,), with_mask: bool = False) -> ModelConfig:
    inputs = [TensorConfig("x", "FP32", x_dims)]
    if with_mask:
        inputs.append(TensorConfig("mask", "INT64", (2,)))
    return ModelConfig(
        name="mlp", max_batch_size=max_batch_size, inputs=tuple(inputs),
        outputs=(TensorConfig("y", "FP32", y_dims), TensorConfig("k", "INT32", (1,))),
        dynamic_batching=DynamicBatching(max_queue_delay_us=delay_us) if max_batch_size else None,
        version=1, model_path="/models/mlp/1/model.onnx",
    )


def request(config: ModelConfig, x: np.ndarray, enqueued_at: float = 0.0, **more: np.ndarray) -> InferRequest:
    inputs = {"x": np.asarray(x, dtype=np.float32), **more}
    batched = config.max_batch_size > 0
    return InferRequest(
        model=config, inputs=inputs, rows=inputs["x"].shape[0] if batched else 1,
        shape_key=tuple(a.shape[1:] if batched else a.shape for a in inputs.values()),
        kserve_id=None, requested_outputs=None, fault=None, future=None, enqueued_at=enqueued_at,
    )


def rows_of(config: ModelConfig, rows: int, first_value: float, enqueued_at: float = 0.0, width: int = 4):
    x = np.arange(rows * width, dtype=np.float32).reshape(rows, width) + first_value
    return request(config, x, enqueued_at)


def queue_with(config: ModelConfig, *requests: InferRequest, capacity_bytes: int = BIG_SLOT_BYTES) -> ModelQueue:
    queue = ModelQueue(config, capacity_bytes)
    for r in requests:
        queue.submit(r)
    return queue


@pytest.fixture
def segment():
    with make_segment(slot_count=2) as seg:
        yield seg


# -- size flush ----------------------------------------------------------------------------
def test_collect_batch_takes_fifo_up_to_max_batch_size_rows_and_leaves_the_rest():
    config = model(max_batch_size=4)
    reqs = [rows_of(config, n, 100 * i, enqueued_at=i) for i, n in enumerate([1, 2, 1, 1, 3])]
    queue = queue_with(config, *reqs)

    first = queue.collect_batch()

    assert first == reqs[:3]
    assert queue.depth == 2
    assert queue.collect_batch() == reqs[3:]
    assert queue.depth == 0
    assert queue.collect_batch() == []


def test_a_multi_row_request_is_never_split_across_batches():
    config = model(max_batch_size=4)
    reqs = [rows_of(config, 3, 0.0, enqueued_at=0), rows_of(config, 2, 10.0, enqueued_at=1)]
    queue = queue_with(config, *reqs)

    assert queue.collect_batch() == [reqs[0]]  # 3 + 2 rows would overflow 4
    assert queue.depth == 1
    assert queue.collect_batch() == [reqs[1]]


def test_unbatched_model_sends_one_request_per_batch():
    config = model(max_batch_size=0)
    reqs = [request(config, np.ones((2, 4)), enqueued_at=i) for i in range(3)]
    queue = queue_with(config, *reqs)

    assert queue.max_rows(reqs[0]) == 1
    assert queue.collect_batch() == [reqs[0]]
    assert queue.depth == 2


# -- time flush ----------------------------------------------------------------------------
def test_flush_due_waits_for_the_oldest_request_plus_the_queue_delay():
    config = model(max_batch_size=4, delay_us=250_000)
    queue = queue_with(config, rows_of(config, 1, 0.0, enqueued_at=100.0),
                       rows_of(config, 1, 0.0, enqueued_at=100.2))

    assert queue.flush_due(100.0) == 100.25
    assert queue.flush_due(100.249) == 100.25
    assert queue.flush_due(100.25) is None  # due: send now
    assert queue.flush_due(101.0) is None


def test_flush_due_is_none_once_the_batch_is_full():
    config = model(max_batch_size=4, delay_us=250_000)
    queue = queue_with(config, rows_of(config, 1, 0.0, enqueued_at=100.0), rows_of(config, 2, 0.0, enqueued_at=100.1))
    assert queue.flush_due(100.1) == 100.25

    queue.submit(rows_of(config, 1, 0.0, enqueued_at=100.11))

    assert queue.flush_due(100.11) is None


def test_zero_queue_delay_is_work_conserving():
    config = model(max_batch_size=4, delay_us=0)
    queue = queue_with(config, rows_of(config, 1, 0.0, enqueued_at=100.0))

    assert queue.flush_due(100.0) is None


def test_flush_due_on_an_empty_queue_is_none():
    assert queue_with(model(delay_us=250_000)).flush_due(0.0) is None


# -- shape groups --------------------------------------------------------------------------
def test_requests_with_different_shapes_never_share_a_batch():
    config = model(max_batch_size=8, x_dims=(-1,))
    a1 = request(config, np.zeros((1, 3)), enqueued_at=1.0)
    b1 = request(config, np.zeros((1, 5)), enqueued_at=2.0)
    a2 = request(config, np.zeros((2, 3)), enqueued_at=3.0)
    queue = queue_with(config, a1, b1, a2)

    assert queue.collect_batch() == [a1, a2]
    assert queue.collect_batch() == [b1]
    assert queue.depth == 0


def test_the_group_with_the_oldest_request_goes_first_whatever_the_submit_order():
    config = model(max_batch_size=8, x_dims=(-1,))
    younger = request(config, np.zeros((1, 3)), enqueued_at=2.0)
    older = request(config, np.zeros((1, 5)), enqueued_at=1.0)
    queue = queue_with(config, younger, older)

    assert queue.collect_batch() == [older]
    assert queue.collect_batch() == [younger]


def test_flush_due_follows_the_oldest_group():
    config = model(max_batch_size=8, x_dims=(-1,), delay_us=250_000)
    queue = queue_with(config, request(config, np.zeros((1, 3)), enqueued_at=2.0),
                       request(config, np.zeros((1, 5)), enqueued_at=1.0))

    assert queue.flush_due(1.0) == 1.25


# -- slot capacity -----------------------------------------------------------------------------
def test_slot_capacity_limits_the_rows_of_a_batch():
    # One row is 1 KiB of x, 1 KiB of y and 4 B of k: 3 rows fit the 8128-byte data area, 4 do not.
    config = model(max_batch_size=64, x_dims=(256,), y_dims=(256,))
    reqs = [rows_of(config, 1, i, enqueued_at=i, width=256) for i in range(5)]
    capacity = 2 * PAGE_BYTES - 64
    queue = queue_with(config, *reqs, capacity_bytes=capacity)

    assert queue.max_rows(reqs[0]) == 3
    assert queue.collect_batch() == reqs[:3]
    assert 4 * (1024 + 1024 + 4) > capacity


def test_a_request_the_codec_accepts_always_fits_one_batch():
    config = model(max_batch_size=1000)
    capacity = 2 * PAGE_BYTES - 64
    rows = (capacity - 3 * 64) // (16 + 16 + 4)  # the most rows of x, y and k the 413 check lets through: 220
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4], "data": [0.0] * (4 * rows)}]})
    loop = asyncio.new_event_loop()
    try:
        accepted = parse_infer_request(config, body, capacity_bytes=capacity, future=loop.create_future(),
                                       allow_faults=False)
    finally:
        loop.close()
    queue = queue_with(config, accepted, capacity_bytes=capacity)

    assert queue.collect_batch() == [accepted]


# -- discard -----------------------------------------------------------------------------------
def test_discard_removes_a_queued_request_once():
    config = model(max_batch_size=4)
    keep, drop = rows_of(config, 1, 0.0, enqueued_at=0), rows_of(config, 1, 1.0, enqueued_at=1)
    queue = queue_with(config, keep, drop)

    assert queue.discard(drop) is True
    assert queue.depth == 1
    assert queue.discard(drop) is False
    assert queue.discard(rows_of(config, 1, 0.0)) is False  # never queued
    assert queue.collect_batch() == [keep]


def test_discard_of_a_shape_never_queued_is_false():
    config = model(max_batch_size=4, x_dims=(-1,))
    queue = queue_with(config, request(config, np.zeros((1, 3))))

    assert queue.discard(request(config, np.zeros((1, 7)))) is False
    assert queue.depth == 1


# -- writing batches into a slot and splitting outputs -------------------------------------------
def three_requests(config: ModelConfig) -> list[InferRequest]:
    """Rows 1, 2, 1 with values that say which request and row they came from."""
    reqs = []
    for i, rows in enumerate([1, 2, 1]):
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + 100 * (i + 1)
        mask = np.full((rows, 2), i + 1, dtype=np.int64)
        reqs.append(request(config, x, enqueued_at=i, mask=mask))
    return reqs


def test_write_batch_puts_each_request_rows_in_order_into_the_slot(segment):
    config = model(max_batch_size=8, with_mask=True)
    reqs = three_requests(config)
    lease = Ring(segment).acquire()

    refs, output_offset = write_batch(segment, lease, reqs)

    assert [(r.name, r.datatype, r.shape) for r in refs] == [("x", "FP32", (4, 4)), ("mask", "INT64", (4, 2))]
    assert all(r.offset % ALIGN_BYTES == 0 for r in refs)
    x = segment.tensor(lease.index, refs[0].offset, np.float32, (4, 4))
    mask = segment.tensor(lease.index, refs[1].offset, np.int64, (4, 2))
    assert np.array_equal(x, np.concatenate([r.inputs["x"] for r in reqs]))
    assert mask[:, 0].tolist() == [1, 2, 2, 3]
    assert refs[1].offset >= refs[0].offset + 4 * 4 * 4  # no overlap
    assert output_offset % ALIGN_BYTES == 0
    assert output_offset >= refs[1].offset + 4 * 2 * 8
    del x, mask


def test_split_outputs_gives_each_request_exactly_its_rows_as_copies(segment):
    config = model(max_batch_size=8, with_mask=True)
    reqs = three_requests(config)
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, reqs)
    batch = SlotBatch(1, config, reqs, SlotUse(lease), refs, output_offset)
    # What a worker would write: y = 2x, k = the row number in the batch.
    y = np.concatenate([r.inputs["x"] for r in reqs]) * 2
    k = np.arange(4, dtype=np.int32).reshape(4, 1)
    (y_offset, k_offset), _ = pack_offsets([y.nbytes, k.nbytes], output_offset)
    segment.tensor(lease.index, y_offset, np.float32, y.shape)[:] = y
    segment.tensor(lease.index, k_offset, np.int32, k.shape)[:] = k
    outputs = [TensorRef("y", "FP32", y.shape, y_offset), TensorRef("k", "INT32", k.shape, k_offset)]

    per_request = split_outputs(segment, batch, outputs)

    assert len(per_request) == 3
    for r, result in zip(reqs, per_request):
        assert set(result) == {"y", "k"}
        assert np.array_equal(result["y"], r.inputs["x"] * 2)
    assert [result["k"].ravel().tolist() for result in per_request] == [[0], [1, 2], [3]]
    segment.tensor(lease.index, 0, np.uint8, (segment.data_capacity,))[:] = 0  # the slot is reused
    assert np.array_equal(per_request[1]["y"], reqs[1].inputs["x"] * 2)


def test_split_outputs_leaves_an_output_bound_for_a_region_a_view_of_the_slot(segment):
    # The scheduler copies it from there into the client's region (gateway/core/regions.py): one copy.
    config = model(max_batch_size=8, with_mask=True)
    reqs = three_requests(config)
    reqs[1].output_regions = {"y": object()}
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, reqs)
    batch = SlotBatch(1, config, reqs, SlotUse(lease), refs, output_offset)
    y = np.concatenate([r.inputs["x"] for r in reqs]) * 2
    slot = segment.tensor(lease.index, output_offset, np.float32, y.shape)
    slot[:] = y

    per_request = split_outputs(segment, batch, [TensorRef("y", "FP32", y.shape, output_offset)])

    assert [np.shares_memory(result["y"], slot) for result in per_request] == [False, True, False]
    assert np.array_equal(per_request[1]["y"], reqs[1].inputs["x"] * 2)


def test_split_outputs_scatters_a_batch_output_by_its_source_input_and_fails_one_too_short(segment):
    """Triton's BATCH_SCATTER_WITH_INPUT_SHAPE: y (dims [-1]) cut per request in the shape of its x."""
    config = dataclasses.replace(model(max_batch_size=8, y_dims=(-1,)),
                                 batch_outputs=(BatchOutput(SCATTER_WITH_INPUT_SHAPE, ("y",), "x"),))
    reqs = [request(config, np.full((rows, 4), rows, np.float32)) for rows in (1, 2)]
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, reqs)
    batch = SlotBatch(1, config, reqs, SlotUse(lease), refs, output_offset)
    y = np.arange(12, dtype=np.float32)
    segment.tensor(lease.index, output_offset, np.float32, y.shape)[:] = y

    one, two = split_outputs(segment, batch, [TensorRef("y", "FP32", y.shape, output_offset)])
    short = split_outputs(segment, batch, [TensorRef("y", "FP32", (11,), output_offset)])

    assert one["y"].tolist() == [[0, 1, 2, 3]] and two["y"].tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
    assert short == [("model 'mlp': output 'y' has 11 elements, fewer than its batch_output's requests' "
                      "shapes [(1, 4), (2, 4)] need", 500)] * 2


def test_split_outputs_of_an_unbatched_model_shapes_a_batch_output_as_its_source_input(segment):
    config = dataclasses.replace(model(max_batch_size=0, x_dims=(-1, 4), y_dims=(-1, 4)),
                                 batch_outputs=(BatchOutput(SCATTER_WITH_INPUT_SHAPE, ("y",), "x"),))
    lease = Ring(segment).acquire()
    y = np.arange(8, dtype=np.float32)
    segment.tensor(lease.index, 128, np.float32, y.shape)[:] = y
    batch = SlotBatch(1, config, [request(config, np.zeros((2, 4)))], SlotUse(lease), [], 128)

    (result,) = split_outputs(segment, batch, [TensorRef("y", "FP32", y.shape, 128)])

    assert result["y"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_split_outputs_of_an_unbatched_model_is_the_whole_tensor(segment):
    config = model(max_batch_size=0)
    lease = Ring(segment).acquire()
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    segment.tensor(lease.index, 128, np.float32, y.shape)[:] = y
    batch = SlotBatch(1, config, [request(config, np.zeros((2, 4)))], SlotUse(lease), [], 128)

    (result,) = split_outputs(segment, batch, [TensorRef("y", "FP32", (2, 3), 128)])

    assert np.array_equal(result["y"], y)


class PlainSegment:
    """Segment.tensor over a private buffer: a failing write leaves no view of shared memory behind."""

    def __init__(self, data_bytes: int) -> None:
        self.data = bytearray(data_bytes)

    def tensor(self, index: int, offset: int, dtype, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(self.data, dtype=dtype, count=count, offset=offset).reshape(shape)


def test_write_batch_copies_the_whole_tensor_of_an_unbatched_model():
    config = model(max_batch_size=0)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    slot = PlainSegment(4096)

    refs, _ = write_batch(slot, SlotLease(0, 1), [request(config, x)])

    assert refs == [TensorRef("x", "FP32", (2, 4), 0)]
    assert np.array_equal(slot.tensor(0, 0, np.float32, (2, 4)), x)


# -- bisecting a batch --------------------------------------------------------------------------
def test_split_halves_share_the_slot_and_point_at_their_own_rows(segment):
    config = model(max_batch_size=8, with_mask=True)
    reqs = three_requests(config) + [request(config, np.full((3, 4), 7.0), enqueued_at=3,
                                             mask=np.full((3, 2), 4, dtype=np.int64))]
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, reqs)  # rows 1, 2, 1, 3
    batch = SlotBatch(5, config, reqs, SlotUse(lease), refs, output_offset, attempt=1, crash_reasons=["SIGSEGV"])

    first, second = batch.split(itertools.count(10))

    assert (first.batch_id, second.batch_id) == (10, 11)
    assert (first.requests, second.requests) == (reqs[:2], reqs[2:])
    assert first.slot is batch.slot and second.slot is batch.slot
    assert batch.slot.open_batches == 2
    assert (first.rows, second.rows) == (3, 4)
    assert [r.shape for r in first.inputs] == [(3, 4), (3, 2)]
    assert [r.shape for r in second.inputs] == [(4, 4), (4, 2)]
    assert [r.offset for r in first.inputs] == [r.offset for r in refs]
    assert second.inputs[0].offset == refs[0].offset + 3 * 4 * 4  # 3 rows of 4 float32
    assert second.inputs[1].offset == refs[1].offset + 3 * 2 * 8  # 3 rows of 2 int64
    x = segment.tensor(lease.index, second.inputs[0].offset, np.float32, second.inputs[0].shape)
    assert np.array_equal(x, np.concatenate([reqs[2].inputs["x"], reqs[3].inputs["x"]]))
    mask = segment.tensor(lease.index, second.inputs[1].offset, np.int64, second.inputs[1].shape)
    assert mask[:, 0].tolist() == [3, 4, 4, 4]
    assert first.output_offset == second.output_offset == output_offset
    assert first.attempt == second.attempt == 1
    first.crash_reasons.append("SIGABRT")
    assert second.crash_reasons == ["SIGSEGV"] and batch.crash_reasons == ["SIGSEGV"]
    del x, mask


def test_splitting_a_half_again_counts_one_more_open_batch(segment):
    config = model(max_batch_size=8)
    reqs = [rows_of(config, 1, 10.0 * i, enqueued_at=i) for i in range(4)]
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, reqs)
    batch = SlotBatch(1, config, reqs, SlotUse(lease), refs, output_offset)
    ids = itertools.count(2)

    _, second = batch.split(ids)
    third, fourth = second.split(ids)

    assert batch.slot.open_batches == 3
    assert (third.requests, fourth.requests) == ([reqs[2]], [reqs[3]])
    assert fourth.inputs[0].offset == refs[0].offset + 3 * 16
    x = segment.tensor(lease.index, fourth.inputs[0].offset, np.float32, fourth.inputs[0].shape)
    assert np.array_equal(x, reqs[3].inputs["x"])
    del x


# -- zero-sized tensors ---------------------------------------------------------------------------------------------
def test_requests_of_zero_rows_batch_with_others_and_get_zero_rows_back(segment):
    config = model(max_batch_size=8)
    row_bytes = 4 * 4 + config.fixed_row_bytes
    capacity = 3 * ALIGN_BYTES + 3 * row_bytes  # a slot that holds 3 rows (and one alignment per tensor)
    reqs = [rows_of(config, 0, 0), rows_of(config, 2, 10), rows_of(config, 0, 0), rows_of(config, 2, 20)]
    queue = queue_with(config, *reqs, capacity_bytes=capacity)

    assert queue.max_rows(reqs[0]) == queue.max_rows(reqs[1]) == 3  # a 0-row head counts its rows' size all the same
    first = queue.collect_batch()
    assert first == reqs[:3] and queue.collect_batch() == reqs[3:]

    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, first)
    assert [ref.shape for ref in refs] == [(2, 4)]
    batch = SlotBatch(1, config, first, SlotUse(lease), refs, output_offset)
    y = segment.tensor(lease.index, refs[0].offset, np.float32, (2, 4)) * 2  # what a worker would write
    k = np.arange(2, dtype=np.int32).reshape(2, 1)
    (y_offset, k_offset), _ = pack_offsets([y.nbytes, k.nbytes], output_offset)
    segment.tensor(lease.index, y_offset, np.float32, y.shape)[:] = y
    segment.tensor(lease.index, k_offset, np.int32, k.shape)[:] = k

    per_request = split_outputs(segment, batch, [TensorRef("y", "FP32", y.shape, y_offset),
                                                 TensorRef("k", "INT32", k.shape, k_offset)])

    assert [result["y"].shape for result in per_request] == [(0, 4), (2, 4), (0, 4)]
    assert [result["k"].shape for result in per_request] == [(0, 1), (2, 1), (0, 1)]
    np.testing.assert_array_equal(per_request[1]["y"], reqs[1].inputs["x"] * 2)


def test_a_batch_of_only_zero_row_requests_is_written_as_a_batch_of_zero_rows(segment):
    config = model(max_batch_size=8, x_dims=(-1,))
    reqs = [request(config, np.zeros((0, 3), np.float32)), request(config, np.zeros((0, 3), np.float32))]
    queue = queue_with(config, *reqs)

    batch = queue.collect_batch()
    refs, _ = write_batch(segment, Ring(segment).acquire(), batch)

    assert batch == reqs and [ref.shape for ref in refs] == [(0, 3)]

