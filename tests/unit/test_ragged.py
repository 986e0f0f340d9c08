"""Triton's ragged batching: batch inputs and the concatenated ragged tensor."""
from __future__ import annotations

import numpy as np
import orjson
import pytest

from ringserve.common.repository.batching import BATCH_INPUT_KINDS, BatchInput

from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.scan import load_model
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.core.errors import PayloadTooLarge
from ringserve.gateway.batching.ragged import batch_input_nbytes, batch_input_tensor, element_offsets
from ringserve.shm.layout import ALIGN_BYTES

from tests.support.models import build_segment_sum
from .conftest import written_batches

# Triton's docs example: three requests of shapes [1, 3], [1, 4], [1, 5].
SOURCES = [np.arange(3, dtype=np.float32).reshape(1, 3), np.arange(4, dtype=np.float32).reshape(1, 4),
           np.arange(5, dtype=np.float32).reshape(1, 5)]


def generated(kind: str, datatype: str = "INT32", sources=SOURCES) -> np.ndarray:
    return batch_input_tensor(BatchInput(kind, "BI", datatype, "INPUT"), sources)


def test_triton_docs_example_accumulated_element_count():
    tensor = generated("BATCH_ACCUMULATED_ELEMENT_COUNT")
    assert tensor.dtype == np.int32 and tensor.tolist() == [3, 7, 12]
    assert element_offsets(SOURCES) == [0, 3, 7, 12]  # and the ragged input is one [12] tensor


@pytest.mark.parametrize("kind, expected", [
    ("BATCH_ELEMENT_COUNT", [3, 4, 5]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 3, 7, 12]),
])
def test_element_counts(kind: str, expected: list[int]):
    assert generated(kind).tolist() == expected


def test_fp32_batch_inputs_carry_the_same_values():
    tensor = generated("BATCH_ACCUMULATED_ELEMENT_COUNT", "FP32")
    assert tensor.dtype == np.float32 and tensor.tolist() == [3.0, 7.0, 12.0]


def test_max_element_count_is_carried_by_the_shape():
    assert generated("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE").shape == (5,)


def test_item_shape_has_one_row_per_batch_item_and_flatten_is_the_same_data():
    sources = [np.zeros((2, 3, 4), np.float32), np.zeros((1, 5, 4), np.float32)]  # 2 items + 1 item
    items = generated("BATCH_ITEM_SHAPE", sources=sources)
    assert items.tolist() == [[3, 4], [3, 4], [5, 4]]
    assert generated("BATCH_ITEM_SHAPE_FLATTEN", sources=sources).tolist() == [3, 4, 3, 4, 5, 4]


@pytest.mark.parametrize("kind", sorted(BATCH_INPUT_KINDS))
@pytest.mark.parametrize("datatype", ["INT32", "FP32"])
def test_batch_input_nbytes_is_what_the_generated_tensor_takes(kind: str, datatype: str):
    for sources in (SOURCES, SOURCES[:1], [np.zeros((2, 3, 4), np.float32), np.zeros((1, 5, 4), np.float32)]):
        batch_input = BatchInput(kind, "BI", datatype, "INPUT")
        assert batch_input_nbytes(batch_input, sources) == batch_input_tensor(batch_input, sources).nbytes


# -- the batcher's slot rule for ragged models ---------------------------------------------------
@pytest.fixture(scope="module")
def segsum(tmp_path_factory) -> ModelConfig:
    repo = tmp_path_factory.mktemp("segsum")
    build_segment_sum(repo)
    return load_model(repo, "segsum")


def segsum_request(loop, config: ModelConfig, elements: int, capacity_bytes: int, value: float = 1.0) -> InferRequest:
    body = orjson.dumps({"inputs": [{"name": "INPUT", "shape": [1, elements], "datatype": "FP32",
                                     "data": [value] * elements}]})
    return parse_infer_request(config, body, capacity_bytes=capacity_bytes, future=loop.create_future(),
                               allow_faults=False)


def test_a_ragged_batch_never_takes_more_bytes_than_the_slot_holds(loop, segment, segsum):
    """max_rows estimates from the head request: a short head would let long requests overflow
    the slot (the write then failed and the whole batch got 500). The batcher checks each batch."""
    capacity = segment.data_capacity  # 8 KiB: one 900-float request takes 3.6 KB
    requests = [segsum_request(loop, segsum, n, capacity, value=i) for i, n in enumerate((2, 2, 900, 900, 900))]
    queue = ModelQueue(segsum, capacity)
    assert queue.max_rows(requests[0]) == segsum.max_batch_size  # the head alone says: all five
    for request in requests:
        queue.submit(request)

    batches = []
    for batch, slot, refs, output_offset in written_batches(queue, segment):
        assert output_offset + len(batch) * segsum.fixed_row_bytes <= capacity
        offsets = next(r for r in refs if r.name == "OFFSETS")
        assert segment.tensor(slot, offsets.offset, np.int32, offsets.shape).tolist() == \
            element_offsets([r.inputs["INPUT"] for r in batch])
        batches.append(batch)

    assert [len(b) for b in batches] == [4, 1]
    assert [r for b in batches for r in b] == requests


def test_the_413_counts_the_generated_batch_input_tensors(loop, segsum):
    elements = 100
    inputs_alone = ALIGN_BYTES * 3 + elements * 4 + segsum.fixed_row_bytes  # INPUT, OFFSETS, SUM
    offsets = 2 * 4  # [0, 100] as INT32
    assert segsum_request(loop, segsum, elements, inputs_alone + offsets).rows == 1
    with pytest.raises(PayloadTooLarge):
        segsum_request(loop, segsum, elements, inputs_alone + offsets - 1)
