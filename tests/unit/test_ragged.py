"""Triton's ragged batching: batch inputs and the concatenated ragged tensor."""
from __future__ import annotations

import numpy as np
import pytest

from common.config import BatchInput
from gateway.ragged import batch_input_tensor, element_offsets

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
