"""Bounds for an input's variable dims: the model parameter `max_shapes`.

A dim of -1 takes any length, and one request of 900,000 tokens took a worker from 106 to 1,034 MiB
of memory. Triton has no bound in `dims` itself; its users write the largest shape an input takes
as a TensorRT optimization profile, in the ONNX Runtime backend's `trt_profile_max_shapes`
parameter (and trtexec's `--maxShapes`): `name:d0xd1x...`, comma-separated, the batch dim
included. ringserve reads the same text from the model's `parameters` (so config.pbtxt can carry
it too: `parameters { key: "max_shapes" value: { string_value: "input_ids:8x512" } }`):

- the shape is the whole tensor's, batch dim first when max_batch_size > 0; that entry must be
  max_batch_size or -1 (the batch dim is bounded by max_batch_size already);
- an entry of -1 leaves that dim unbounded; under a fixed config dim the entry must equal it;
- inputs not named are unbounded. A request past a bound gets 400 naming the bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ringserve.common.errors import ConfigError

PARAMETER = "max_shapes"
FIELD = f"parameters.{PARAMETER}"


def parameter_text(parameters: Any) -> str | None:
    """The `max_shapes` value of a config's `parameters` ({"key": {"string_value": "v"}}), or None."""
    if not isinstance(parameters, Mapping) or PARAMETER not in parameters:
        return None
    value = parameters[PARAMETER]
    text = value.get("string_value") if isinstance(value, Mapping) else value
    if not isinstance(text, str):
        raise ConfigError(None, FIELD, f'must be a string_value such as "input_ids:8x512", got {value!r}')
    return text


def read_max_shapes(
    text: str, dims_by_input: Mapping[str, Sequence[int]], max_batch_size: int
) -> dict[str, tuple[int, ...]]:
    """input name -> its largest dims without the batch dim (-1: unbounded), from `text`."""
    bounds: dict[str, tuple[int, ...]] = {}
    for entry in (part.strip() for part in text.split(",")):
        name, sep, shape = entry.rpartition(":")
        if not sep or not name or not shape:
            raise ConfigError(
                None,
                FIELD,
                f'entry {entry!r} is not name:shape; write e.g. "input_ids:8x512,'
                'attention_mask:8x512" (the batch dim first, as trt_profile_max_shapes)',
            )
        if name not in dims_by_input:
            raise ConfigError(None, FIELD, f"{name!r} is not an input; inputs: {sorted(dims_by_input)}")
        if name in bounds:
            raise ConfigError(None, FIELD, f"bounds {name!r} twice")
        bounds[name] = _input_bounds(name, shape, tuple(dims_by_input[name]), max_batch_size)
    return bounds


def _input_bounds(name: str, shape_text: str, dims: tuple[int, ...], max_batch_size: int) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in shape_text.split("x"))
    except ValueError:
        raise ConfigError(
            None, FIELD, f"{name!r}: shape {shape_text!r} must be integers joined by 'x', e.g. 8x512"
        ) from None
    batched = max_batch_size > 0
    full = ([-1] if batched else []) + list(dims)
    if len(shape) != len(full):
        raise ConfigError(
            None,
            FIELD,
            f"{name!r}: {shape_text!r} has {len(shape)} dims; the input has {len(full)} "
            f"({'x'.join(map(str, full))}, batch dim included)",
        )
    if batched and shape[0] not in (-1, max_batch_size):
        raise ConfigError(
            None,
            FIELD,
            f"{name!r}: the batch dim's bound is max_batch_size ({max_batch_size}); "
            f"write {max_batch_size} or -1 there, got {shape[0]}",
        )
    bounds = shape[1:] if batched else shape
    for i, (bound, dim) in enumerate(zip(bounds, dims)):
        if bound != -1 and bound < 1:
            raise ConfigError(None, FIELD, f"{name!r}: dim {i + batched} bound must be >= 1 or -1, got {bound}")
        if dim != -1 and bound not in (-1, dim):
            raise ConfigError(
                None,
                FIELD,
                f"{name!r}: dim {i + batched} is fixed at {dim} by dims; its bound must be {dim} or -1, got {bound}",
            )
    return tuple(-1 if dim != -1 else bound for bound, dim in zip(bounds, dims))
