"""The largest tensors a request may carry, checked from its shape before any of its data is read.

Two bounds, both 400 with the numbers: a variable dim past the model's `parameters.max_shapes`
(common/repository/max_shapes.py: Triton's `trt_profile_max_shapes` form), and any input over the server's
--max-tensor-bytes. The slot's capacity (413, gateway/codec/parse.py) bounds a request as a whole; these
bound what one tensor makes a worker allocate while it runs (900,000 tokens took one from 106 to
1,034 MiB).
"""

from __future__ import annotations

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.core.errors import BadRequest


def check_bounds(config: ModelConfig, tensor: TensorConfig, shape: list[int]) -> None:
    """400 for a dim of `shape` (the request's, batch dim included) past its bound in `config.max_dims`."""
    bounds = config.max_dims.get(tensor.name)
    if bounds is None:
        return
    batched = config.max_batch_size > 0
    for i, (d, bound) in enumerate(zip(shape[batched:], bounds)):
        if bound != -1 and d > bound:
            largest = ([config.max_batch_size] if batched else []) + list(bounds)
            raise BadRequest(
                f"input {tensor.name!r}: shape {shape} has {d} at dim {i + batched}; model "
                f"{config.name!r} takes at most {bound} there (parameters.max_shapes: "
                f"{'x'.join(map(str, largest))}, -1 = any size)"
            )


def check_tensor_bytes(tensor: TensorConfig, shape: tuple[int, ...], nbytes: int, max_tensor_bytes: int) -> None:
    """400 for an input of `nbytes` (its size in the slot) over --max-tensor-bytes."""
    if nbytes > max_tensor_bytes:
        raise BadRequest(
            f"input {tensor.name!r}: shape {list(shape)} {tensor.datatype} is {nbytes} bytes; this server "
            f"takes tensors of at most {max_tensor_bytes} bytes (--max-tensor-bytes)"
        )
