"""Shapes the model sees that differ from the client's: Triton's `reshape`, `batch_output` and `is_shape_tensor`.

    reshape           input:  the client sends `dims` (batch dim first when max_batch_size > 0); the model
                              gets `reshape.shape`, each -1 taken, in order, from the request's variable dims
                              (core's InferenceRequest::Normalize). `dims: [1] reshape: { shape: [] }` feeds
                              a batched model a [batch] tensor.
                      output: the model gives `reshape.shape`; the client gets `dims`, the -1s filled in order
                              (core's InferenceResponse::Output::Reshape).
    batch_output      BATCH_SCATTER_WITH_INPUT_SHAPE: the model's output for the whole batch is cut, in
                      request order, into one piece per request whose shape is the output's (batch dim first
                      when batched), each -1 taken from the same axis of the request's `source_input`
                      (the backend's BackendOutputResponder::ProcessBatchOutput). With a ragged source, a
                      per-element output of the concatenated batch goes back to each request in its shape.
    is_shape_tensor   only TensorRT has shape tensors: Triton's core refuses `true` for any other platform
                      in these words, and so does ringserve; `false` is the default and loads.

The checks and their messages are core's (model_config_utils.cc: ValidateIOShape, ValidateBatchIO). The
worker applies reshape around each ONNX Runtime run (worker/session.py); the gateway cuts batch outputs
(gateway/batching/slot_outputs.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ringserve.common.errors import ConfigError
from ringserve.common.repository.fields import as_int

WILDCARD = -1
SCATTER_WITH_INPUT_SHAPE = "BATCH_SCATTER_WITH_INPUT_SHAPE"
SHAPE_TENSORS_REFUSED = "shape tensors are only supported for TensorRT platform"


def read_reshape(doc: Mapping[str, Any], tensor: str) -> tuple[int, ...] | None:
    """A tensor's `reshape: {shape: [...]}` (None without one; () is the empty reshape)."""
    reshape = doc.get("reshape")
    if reshape is None:
        return None
    if not isinstance(reshape, Mapping):
        raise ConfigError(None, "reshape", f"tensor {tensor!r}: must be {{'shape': [...]}}, got {reshape!r}")
    shape = reshape.get("shape", [])
    if not isinstance(shape, list):
        raise ConfigError(None, "reshape.shape", f"tensor {tensor!r}: must be a list, got {shape!r}")
    return tuple(as_int(d, "reshape.shape") for d in shape)


def _element_count(dims: Sequence[int]) -> int:
    return WILDCARD if WILDCARD in dims else math.prod(dims)


def _fixed_runs(dims: Sequence[int]) -> list[int]:
    """The element counts between variable dims: [2, 4, -1, 6] -> [8, 6]."""
    runs, current = [], 1
    for d in dims:
        if d == WILDCARD:
            runs.append(current)
            current = 1
        else:
            current *= d
    return [*runs, current]


def check_reshape(kind: str, name: str, dims: tuple[int, ...], reshape: tuple[int, ...], max_batch_size: int) -> None:
    """Core's ValidateIOShape for a reshape; `kind` is "input" or "output"."""
    prefix = f"model {kind} '{name}' "
    field = f"{kind}.reshape"
    if not reshape and max_batch_size == 0:
        raise ConfigError(
            None, field, prefix + "cannot have empty reshape for non-batching model as scalar tensors are not supported"
        )
    if any(d < 1 and d != WILDCARD for d in reshape):
        raise ConfigError(
            None, field, prefix + "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"
        )
    dims_size, reshape_size = _element_count(dims), _element_count(reshape) if reshape else 0
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        raise ConfigError(None, field, prefix + "has different size for dims and reshape")
    if dims_size == WILDCARD:
        from_runs, to_runs = _fixed_runs(dims), _fixed_runs(reshape)
        if len(from_runs) != len(to_runs):
            raise ConfigError(
                None, field, prefix + "has different number of variable-size dimensions for dims and reshape"
            )
        if from_runs != to_runs:
            raise ConfigError(None, field, prefix + "has different size for dims and reshape")


def check_shape_tensor(name: str, value: Any) -> None:
    """A tensor's is_shape_tensor: false loads; true is refused in core's words (ValidateModelInput/Output)."""
    if type(value) is not bool:
        raise ConfigError(None, "is_shape_tensor", f"tensor {name!r}: must be true or false, got {value!r}")
    if value:
        raise ConfigError(None, "is_shape_tensor", SHAPE_TENSORS_REFUSED)


def refill(shape: Sequence[int], from_dims: Sequence[int], to_dims: Sequence[int], batched: bool) -> tuple[int, ...]:
    """`shape` (an actual tensor's, laid out as `from_dims` with the batch dim first when `batched`) laid out as
    `to_dims`: its values at from_dims' -1s fill to_dims' -1s in order (core's Normalize and Output::Reshape)."""
    lead = tuple(shape[:1]) if batched else ()
    body = shape[1:] if batched else shape
    variable = iter(size for size, d in zip(body, from_dims) if d == WILDCARD)
    return lead + tuple(next(variable, 1) if d == WILDCARD else d for d in to_dims)


@dataclass(frozen=True)
class BatchOutput:
    """Triton's batch_output: an output the server cuts per request by the shape of one of its inputs."""

    kind: str
    target_names: tuple[str, ...]
    source_input: str

    @classmethod
    def from_json(cls, doc: Any) -> BatchOutput:
        if not isinstance(doc, Mapping):
            raise ConfigError(None, "batch_output", f"entries must be objects, got {doc!r}")
        kind = doc.get("kind", SCATTER_WITH_INPUT_SHAPE)  # proto3's default: the enum's 0
        if kind != SCATTER_WITH_INPUT_SHAPE:
            raise ConfigError(None, "batch_output.kind", f"unknown batch output kind '{kind}'")
        targets, sources = doc.get("target_name") or [], doc.get("source_input") or []
        targets = [targets] if isinstance(targets, str) else targets
        sources = [sources] if isinstance(sources, str) else sources
        if len(sources) != 1:
            raise ConfigError(
                None,
                "batch_output.source_input",
                f"batch output kind '{kind}' expects 1 source input, got {len(sources)}",
            )
        seen: set[str] = set()
        for target in targets:
            if target in seen:
                raise ConfigError(
                    None, "batch_output.target_name", f"target output name '{target}' can only be specified once"
                )
            seen.add(target)
        return cls(kind=kind, target_names=tuple(map(str, targets)), source_input=str(sources[0]))

    def check(self, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        if self.source_input not in inputs:
            raise ConfigError(None, "batch_output.source_input", f"unknown source input name '{self.source_input}'")
        for target in self.target_names:
            if target not in outputs:
                raise ConfigError(None, "batch_output.target_name", f"unknown target output name '{target}'")

    def to_json(self) -> dict[str, Any]:
        return {"target_name": list(self.target_names), "kind": self.kind, "source_input": [self.source_input]}


def scatter_shapes(dims: Sequence[int], batched: bool, source_shapes: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Each request's piece of a BATCH_SCATTER_WITH_INPUT_SHAPE output: the output's shape (batch dim first when
    `batched`, as -1), each -1 the size of the same axis of that request's source input (the backend's naive
    mapping; an axis the input lacks counts 1)."""
    layout = [WILDCARD, *dims] if batched else list(dims)
    return [
        tuple((shape[axis] if axis < len(shape) else 1) if d == WILDCARD else d for axis, d in enumerate(layout))
        for shape in source_shapes
    ]
