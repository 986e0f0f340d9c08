"""Triton's ragged batching: concatenated 1-D inputs and the batch inputs that describe them.

An input with `allow_ragged_batch` may differ in length between requests; the batch
concatenates every request's elements into one 1-D tensor. The model learns where each
request's piece lies from `batch_input` entries, generated here with Triton's kinds and
semantics (as its backends' BackendInputCollector computes them):

    BATCH_ELEMENT_COUNT                        [requests]      elements of each request
    BATCH_ACCUMULATED_ELEMENT_COUNT            [requests]      running sum: end offsets
    BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO  [requests + 1]  0, then the running sum
    BATCH_MAX_ELEMENT_COUNT_AS_SHAPE           [max elements]  only its shape carries meaning
    BATCH_ITEM_SHAPE                           [rows, ndim-1]  each batch item's shape
    BATCH_ITEM_SHAPE_FLATTEN                   [rows*(ndim-1)] the same, flattened
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np

from ringserve.common.repository.batching import BatchInput
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.datatypes import numpy_dtype


def batch_input_tensor(batch_input: BatchInput, sources: list[np.ndarray]) -> np.ndarray:
    """The generated tensor for one batch_input, from each request's source input (batch dim first)."""
    dtype = numpy_dtype(batch_input.datatype)
    counts = [a.size for a in sources]
    kind = batch_input.kind
    if kind == "BATCH_ELEMENT_COUNT":
        return np.asarray(counts, dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.asarray(list(itertools.accumulate(counts)), dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.asarray([0, *itertools.accumulate(counts)], dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(max(counts), dtype)
    shapes = [row_shape for a in sources for row_shape in [a.shape[1:]] * a.shape[0]]
    items = np.asarray(shapes, dtype).reshape(len(shapes), -1)
    if kind == "BATCH_ITEM_SHAPE":
        return items
    return items.reshape(-1)  # BATCH_ITEM_SHAPE_FLATTEN


def batch_input_nbytes(batch_input: BatchInput, sources: list[np.ndarray]) -> int:
    """batch_input_tensor(...).nbytes, without building it (the batcher asks per candidate)."""
    itemsize = numpy_dtype(batch_input.datatype).itemsize
    kind = batch_input.kind
    if kind in ("BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT"):
        return itemsize * len(sources)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return itemsize * (len(sources) + 1)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return itemsize * max(a.size for a in sources)
    return itemsize * sum(a.shape[0] * (a.ndim - 1) for a in sources)  # BATCH_ITEM_SHAPE[_FLATTEN]


def batch_inputs_nbytes(config: ModelConfig, inputs: list[Mapping[str, np.ndarray]]) -> int:
    """What a batch of requests with these inputs takes for its generated batch_input tensors."""
    return sum(batch_input_nbytes(b, [i[b.source_input] for i in inputs]) for b in config.batch_inputs)


def element_offsets(sources: list[np.ndarray]) -> list[int]:
    """Where each request's piece starts in the concatenated tensor, and the total at the end."""
    return [0, *itertools.accumulate(a.size for a in sources)]
