"""Triton's classification extension: an output answered as its top classes, not its values.

A requested output with `parameters.classification: K` (HTTP), or `parameters["classification"]`
int64 K (gRPC's InferRequestedOutputTensor, tritonclient's `class_count`), is answered as a BYTES
tensor of the K highest values of each batch row (the row's non-batch dims flattened), best
first, each "value:index" or "value:index:label" with the label of that index from the output's
`label_filename` (common/repository/scan.py reads it). Shape [rows, K] for a batching model, [K]
otherwise; K is cut to the elements of a row. As Triton's server (src/classification.cc and
http_server.cc) writes it: the value through C's "%f" (std::to_string: 6 decimals) for
floating types, "%d" for integer ones; an index whose label line is empty or missing has no label.

Where Triton's std::sort leaves the order of equal values to the library, the lower index comes
first here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.core.errors import BadRequest
from ringserve.gateway.core.phrases import say

PARAM = "classification"
# Triton's kMaxClassificationElements: a classified row is sorted whole, so its size is bounded.
MAX_ELEMENTS = 1_000_000
# The datatypes Triton classifies (classification.cc's switch): numbers, not FP16/BF16, BOOL or BYTES.
CLASSIFIABLE = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"})


def class_count(config: ModelConfig, tensor: TensorConfig, value: Any) -> int:
    """The K a requested output's parameters ask for (0: not classified); BadRequest when it cannot be."""
    if type(value) is not int or value < 0:
        raise BadRequest(
            say(
                "classification_value",
                f"output {tensor.name!r}: parameters.classification must be "
                f"a non-negative integer (the number of classes), got "
                f"{value!r}",
            )
        )
    if value == 0:
        return 0
    if tensor.datatype not in CLASSIFIABLE:
        accepted = ", ".join(sorted(CLASSIFIABLE))
        raise BadRequest(
            say(
                "classification_type",
                f"output {tensor.name!r} is {tensor.datatype}; classes are the "
                f"top values of a numeric output ({accepted})",
                datatype=tensor.datatype,
            )
        )
    if all(d > 0 for d in tensor.dims) and math.prod(tensor.dims) > MAX_ELEMENTS:
        raise BadRequest(too_large(tensor.name, math.prod(tensor.dims)))
    return value


def classified(config: ModelConfig, classes: dict[str, int], outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`outputs` with each classified one replaced by its BYTES answer (the encoders answer it as BYTES)."""
    return {**outputs, **{name: classify(config, name, outputs[name], count) for name, count in classes.items()}}


def too_large(name: str, elements: int) -> str:
    return say(
        "classification_size",
        f"output {name!r} has {elements} elements a row; the classification extension ranks at most {MAX_ELEMENTS}",
    )


def classify(config: ModelConfig, name: str, array: np.ndarray, count: int) -> np.ndarray:
    """The BYTES answer (an object array of bytes) for output `name`'s values `array` and K = `count`."""
    tensor = config.output(name)
    batched = config.max_batch_size > 0 and array.ndim > 0
    rows = array.reshape(array.shape[0], -1) if batched else array.reshape(1, -1)
    if rows.shape[1] > MAX_ELEMENTS:
        raise BadRequest(too_large(name, rows.shape[1]))
    k = min(count, rows.shape[1])
    text = "%f" if rows.dtype.kind == "f" else "%d"
    labels = tensor.labels
    answer = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        for j, index in enumerate(top_indices(row, k)):
            label = labels[index] if index < len(labels) else ""
            entry = f"{text % row[index]}:{index}"
            answer[r, j] = (f"{entry}:{label}" if label else entry).encode()
    return answer if batched else answer.reshape(k)


def top_indices(row: np.ndarray, k: int) -> list[int]:
    """The indices of the k highest values, highest first; equal values by ascending index (a stable
    sort of the reversed row, reversed back)."""
    n = len(row)
    order = (n - 1 - np.argsort(row[::-1], kind="stable"))[::-1]
    return [int(i) for i in order[:k]]
