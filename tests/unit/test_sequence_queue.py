"""gateway/batching/sequences.py and steps.py: a sequence's steps one per batch, in order; candidate slots and
the backlog; the state written into the slot and committed back; Triton's words for a step it refuses."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator

import numpy as np
import pytest

from ringserve.common.repository.config import ModelConfig
from ringserve.common.wire import TensorRef
from ringserve.gateway.batching.sequences import SequenceQueue, commit_batch_states
from ringserve.gateway.batching.state_stores import StateStores
from ringserve.gateway.batching.slots import write_batch
from ringserve.gateway.batching.steps import read_step
from ringserve.gateway.core.errors import BadRequest, GatewayError, Unsupported
from ringserve.gateway.core.request import InferRequest
from ringserve.shm.ring import Ring
from ringserve.shm.states import unlink_stores
from tests.support.sequence_models import accumulator_config

from .conftest import make_segment


def model(**config) -> ModelConfig:
    return ModelConfig.from_json("acc", accumulator_config(**config), version=1, model_path="/r/acc/1/model.onnx")


def step(config: ModelConfig, key: int | str, value: float, *, start: bool = False, end: bool = False) -> InferRequest:
    params = {"sequence_id": key, "sequence_start": start, "sequence_end": end}
    return InferRequest(
        model=config, inputs={"INPUT": np.array([[value]], np.float32)}, rows=1, shape_key=((1,),),
        kserve_id=None, requested_outputs=None, fault=None, future=None, sequence=read_step(config, params, 1),
    )


@pytest.fixture
def stores() -> Iterator[StateStores]:
    stores = StateStores(f"ringserve-{os.getpid()}-{secrets.token_hex(4)}-state-")
    answers: list[tuple[InferRequest, GatewayError | None]] = []

    def finish(request: InferRequest, result=None, error=None) -> None:  # as Answers.finish does
        if request.done:
            return
        request.done = True
        answers.append((request, error))
        if request.sequence.release is not None:
            request.sequence.release(request)

    stores.finish, stores.answers = finish, answers
    try:
        yield stores
    finally:
        stores.close()
        unlink_stores(stores.prefix)


def run(body) -> None:
    async def main() -> None:
        body()

    asyncio.run(main())


def test_a_batch_takes_one_step_of_each_sequence_and_the_next_step_only_after_the_answer(stores):
    config = model()
    queue = SequenceQueue(config, 1 << 20, stores)

    def body() -> None:
        a = [step(config, 1, v, start=(v == 1)) for v in (1, 2, 3)]
        b = [step(config, 2, 10, start=True)]
        for r in (*a, *b):
            queue.submit(r)
        assert queue.collect_batch() == [a[0], b[0]]
        assert queue.collect_batch() == []  # a's second step waits for its first's answer
        stores.finish(a[0], result={})
        assert queue.collect_batch() == [a[1]]
        stores.finish(a[1], result={})
        stores.finish(b[0], result={})
        assert queue.collect_batch() == [a[2]]

    run(body)


def test_sequences_beyond_the_candidate_slots_wait_in_the_backlog_until_one_ends(stores):
    config = model(candidates=1)
    queue = SequenceQueue(config, 1 << 20, stores)

    def body() -> None:
        first = [step(config, 1, 1, start=True), step(config, 1, 2, end=True)]
        waiting = step(config, 2, 5, start=True)
        for r in (first[0], waiting, first[1]):
            queue.submit(r)
        assert queue.collect_batch() == [first[0]] and queue.status()["backlog"] == 1
        stores.finish(first[0], result={})
        assert queue.collect_batch() == [first[1]]
        stores.finish(first[1], result={})  # END: its entry frees, the backlog's sequence takes it
        assert queue.collect_batch() == [waiting] and queue.status()["backlog"] == 0

    run(body)


def test_a_step_of_an_unknown_sequence_without_start_is_refused_in_tritons_words(stores):
    config = model()
    queue = SequenceQueue(config, 1 << 20, stores)

    def body() -> None:
        with pytest.raises(BadRequest) as caught:
            queue.submit(step(config, 37469245, 1))
        assert str(caught.value).startswith(
            "inference request for sequence 37469245 to model 'acc' must specify the START flag on the first "
            "request of the sequence"
        )

    run(body)


def test_the_state_goes_into_the_slot_and_only_a_committed_result_changes_it(stores):
    config = model(state_width=2)
    queue = SequenceQueue(config, 1 << 20, stores)
    def body(segment) -> None:
        first = InferRequest(
            model=config, inputs={"INPUT": np.array([[1, 2]], np.float32)}, rows=1, shape_key=((2,),),
            kserve_id=None, requested_outputs=None, fault=None, future=None,
            sequence=read_step(config, {"sequence_id": 9, "sequence_start": True}, 1),
        )
        queue.submit(first)
        (taken,) = queue.collect_batch()
        ring = Ring(segment)
        lease = ring.acquire()
        refs, out = write_batch(segment, lease, [taken])
        by_name = {r.name: r for r in refs}
        start = segment.tensor(lease.index, by_name["START"].offset, np.dtype(np.int32), by_name["START"].shape)
        state = segment.tensor(lease.index, by_name["INPUT_STATE"].offset, np.dtype(np.float32), (1, 2))
        corrid = segment.tensor(lease.index, by_name["CORRID"].offset, np.dtype(np.uint64), (1, 1))
        assert (start.tolist(), state.tolist(), corrid.tolist()) == ([[1]], [[0.0, 0.0]], [[9]])
        # the worker's output state, at the output offset, as its RESULT names it
        segment.tensor(lease.index, out, np.dtype(np.float32), (1, 2))[:] = [[7, 8]]
        outputs = [TensorRef("OUTPUT_STATE", "FP32", (1, 2), out)]
        rest = commit_batch_states(segment, lease.index, [taken], outputs, queue)
        assert rest == []  # the state output is not the client's
        stores.finish(taken, result={})
        second = InferRequest(
            model=config, inputs={"INPUT": np.array([[1, 1]], np.float32)}, rows=1, shape_key=((2,),),
            kserve_id=None, requested_outputs=None, fault=None, future=None,
            sequence=read_step(config, {"sequence_id": 9}, 1),
        )
        queue.submit(second)
        (taken,) = queue.collect_batch()
        lease = ring.acquire()
        refs, _ = write_batch(segment, lease, [taken])
        ref = next(r for r in refs if r.name == "INPUT_STATE")
        assert segment.tensor(lease.index, ref.offset, np.dtype(np.float32), (1, 2)).tolist() == [[7.0, 8.0]]

    with make_segment(slot_count=2, slot_bytes=1 << 16) as segment:
        run(lambda: body(segment))


@pytest.mark.parametrize(
    "params, rows, error, message",
    [
        ({"sequence_id": 1}, 2, BadRequest,
         "inference request to model 'acc' must specify batch-size 1 due to requirements of sequence batcher"),
        ({}, 1, BadRequest, "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": ""}, 1, BadRequest,
         "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": "x" * 129}, 1, Unsupported, "string correlation ID cannot be longer than 128 characters"),
        ({"sequence_id": "abc"}, 1, BadRequest,
         "sequence batching control 'CORRID' data-type is 'BYTES', but model 'acc' expects 'UINT64'"),
        ({"sequence_id": -1}, 1, BadRequest, "Unable to parse 'sequence_id'"),
        ({"sequence_id": 1, "sequence_start": 1}, 1, BadRequest, "Unable to parse 'sequence_start'"),
    ],
)
def test_a_step_triton_refuses_is_refused_in_its_words(params, rows, error, message):
    with pytest.raises(error) as caught:
        read_step(model(), params, rows)
    assert str(caught.value).startswith(message)
