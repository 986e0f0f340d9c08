"""Variable-length inputs: which requests may share a batch, and the padded batch shapes.

Without `padding` in the model's dynamic_batching, requests batch only when every
non-batch dim is equal (Triton's rule). With it, variable dims (-1 in the config) are
padded to the longest request of the batch, and `sequence_buckets` keep short requests
away from long ones: a request goes to the smallest bucket that holds its length.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from ringserve.common.repository.config import ModelConfig

OVERFLOW_BUCKET = -1  # longer than the last bucket: padded only to the longest of its batch


def request_length(config: ModelConfig, inputs: dict[str, np.ndarray]) -> int:
    """The longest variable dim of any input: what buckets and padding waste are measured in."""
    batched = config.max_batch_size > 0
    length = 0
    for name, array in inputs.items():
        for i, d in enumerate(config.inputs_by_name[name].dims):
            if d == -1:
                length = max(length, array.shape[i + batched])
    return length


def group_key(config: ModelConfig, inputs: dict[str, np.ndarray], exact_shapes: tuple) -> tuple:
    """Requests with equal keys may share one batch (and one network call).

    Ragged inputs do not count (they are concatenated); inputs named in
    `separate_by_inputs` (an OP switch, say) count by value.
    """
    batching = config.dynamic_batching
    values = ()
    if batching is not None and batching.separate_by_inputs:
        values = tuple(inputs[name].tobytes() for name in batching.separate_by_inputs)
    if config.ragged_inputs:
        exact_shapes = tuple(a.shape[1:] for n, a in inputs.items() if n not in config.ragged_inputs)
    if batching is None or batching.padding is None or config.max_batch_size == 0:
        return ("shape", exact_shapes, values)
    buckets = batching.sequence_buckets
    if not buckets:
        return ("padded", 0, values)
    length = request_length(config, inputs)
    index = bisect.bisect_left(buckets, length)
    return ("padded", buckets[index] if index < len(buckets) else OVERFLOW_BUCKET, values)


def padded_shapes(requests: list, rows: int) -> list[tuple[int, ...]]:
    """Per input: (rows, longest of each non-batch dim over the batch)."""
    first = requests[0]
    shapes = []
    for name, sample in first.inputs.items():
        dims = list(sample.shape[1:])
        for request in requests[1:]:
            dims = [max(a, b) for a, b in zip(dims, request.inputs[name].shape[1:])]
        shapes.append((rows, *dims))
    return shapes


def real_and_padded_elements(requests: list, shapes: list[tuple[int, ...]]) -> tuple[int, int]:
    """Elements the requests brought, and elements added by padding (batch-dim padding included)."""
    real = sum(a.size for r in requests for a in r.inputs.values())
    total = sum(math.prod(s) for s in shapes)
    return real, total - real


def padded_rows(config: ModelConfig, rows: int) -> int:
    """The batch dim as sent: `rows`, or the next preferred batch size with pad_to_preferred_batch_size."""
    batching = config.dynamic_batching
    if not (batching and batching.pad_to_preferred_batch_size):
        return rows
    bigger = [p for p in batching.preferred_batch_size if rows <= p <= config.max_batch_size]
    return min(bigger) if bigger else rows
