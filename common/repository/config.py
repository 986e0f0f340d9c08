"""Triton's model config (config.json, or config.pbtxt read into the same document by
common/repository/pbtxt.py) as frozen dataclasses: parsing, validation, to_json.

Field names and meanings are Triton's (`max_batch_size`, `input`/`output` with
`data_type: "TYPE_FP32"`, `dynamic_batching`, `batch_input`), plus ringserve's extensions
in dynamic_batching (padding, sequence buckets, latency target). What config.json leaves
out is auto-completed from the ONNX graph by common/repository/scan.py.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringserve.common.errors import ConfigError
from ringserve.common.metrics_config import first_response_buckets
from ringserve.common.repository import kinds as model_kinds
from ringserve.common.repository import response_cache, sequences, warmup
from ringserve.common.repository.batching import BatchInput, DynamicBatching
from ringserve.common.repository.call_bounds import Hook, read_call_bounds
from ringserve.common.repository.fields import as_int, check_fields
from ringserve.common.repository.kinds import ONNX_PLATFORM, PYTHON_BACKEND, EnsembleStep, ModelKind
from ringserve.common.repository.lifecycle import Lifecycle
from ringserve.common.repository.max_shapes import parameter_text, read_max_shapes
from ringserve.common.repository.reshape import BatchOutput, check_reshape
from ringserve.common.repository.tensor_config import MAX_TENSOR_DIMS, TensorConfig, naming_model, too_many_dims


def _model_dir(model_path: str) -> Path:
    """<repo>/<model> from a version's path (<version>/model.onnx, <version>/model.py, an ensemble's <version>)."""
    path = Path(model_path)
    return path.parent.parent if path.suffix else path.parent


def _state_bounds(doc: Mapping[str, Any], max_batch_size: int) -> dict[str, tuple[int, ...]]:
    """parameters.max_shapes' bounds of state inputs (the session's window); {} where it names none."""
    text = parameter_text(doc.get("parameters"))
    states = (doc.get("sequence_batching") or {}).get("state") or ()
    if text is None or not isinstance(states, list):
        return {}
    dims = {s.get("input_name", ""): tuple(as_int(d, "dims") for d in s.get("dims", ())) for s in states}
    entries = [entry for entry in text.split(",") if entry.strip().rpartition(":")[0] in dims]
    return read_max_shapes(",".join(entries), dims, max_batch_size) if entries else {}


_MODEL_KEYS = {
    "name",
    "platform",
    "max_batch_size",
    "input",
    "output",
    "dynamic_batching",
    "batch_input",
    "batch_output",
    "sequence_batching",
}


@dataclass(frozen=True)
class ModelConfig:
    """One servable model version; `to_json()` is what `/v2/models/{m}/config` returns."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    dynamic_batching: DynamicBatching | None
    version: int
    model_path: str  # absolute path to <repo>/<model>/<version>/model.onnx (model.py; an ensemble's: <version>/)
    platform: str = ONNX_PLATFORM  # "" for backend: "python" (Triton's spelling), "ensemble"
    batch_inputs: tuple[BatchInput, ...] = ()
    # The other top-level fields config_fields.MODEL accepts (instance_group, version_policy,
    # model_load_policy, parameters, Triton's ignored ones), kept verbatim.
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # Requests that name no version reach this one: the highest version the version_policy serves.
    default_version: bool = True
    # Read from the lifecycle keys of `extra` (common/repository/lifecycle.py), so it always agrees with them.
    lifecycle: Lifecycle = field(default=Lifecycle(), init=False)
    # Triton's sequence_batching (common/repository/sequences.py): stateful sequences; None for the usual model.
    sequence_batching: sequences.SequenceBatching | None = None
    # Triton's batch_output (common/repository/reshape.py): outputs cut per request by an input's shape.
    batch_outputs: tuple[BatchOutput, ...] = ()

    def __post_init__(self) -> None:
        with naming_model(self.name):
            self._validate()
            object.__setattr__(self, "lifecycle", Lifecycle.from_config_doc(self.extra))
            self.warmup_samples  # noqa: B018 - model_warmup (it reads lifecycle's warmup): refused at load
        object.__setattr__(self, "extra", types.MappingProxyType(dict(self.extra)))

    @functools.cached_property
    def key(self) -> str:
        """Names this version's queue and state at the gateway: 'm' for the default version, else 'm/2'."""
        return self.name if self.default_version else f"{self.name}/{self.version}"

    def _validate(self) -> None:
        if not self.name:
            raise ConfigError(None, "name", "model names must be non-empty")
        model_kinds.kind_of(self.platform, self.extra.get("backend"))  # ConfigError naming what is served
        if self.max_batch_size < 0:
            raise ConfigError(None, "max_batch_size", f"must be >= 0, got {self.max_batch_size}")
        if self.version < 1:
            raise ConfigError(None, "version", f"must be >= 1, got {self.version}")
        first_response_buckets(self.extra.get("model_metrics"))  # ConfigError in Triton's words
        for field_name, tensors in (("input", self.inputs), ("output", self.outputs)):
            names = [t.name for t in tensors]
            if not names:
                raise ConfigError(None, field_name, "at least one tensor is required")
            if len(set(names)) != len(names):
                raise ConfigError(None, field_name, f"tensor names must be unique, got {names}")
        batched = [t for t in (*self.inputs, *self.outputs) if len(t.dims) + 1 > MAX_TENSOR_DIMS]
        if batched and self.max_batch_size > 0:
            tensor = batched[0]
            raise ConfigError(None, "dims", too_many_dims(tensor.name, len(tensor.dims) + 1, batched=True))
        inputs = {t.name: t for t in self.inputs}
        for batch_input in self.batch_inputs:
            source = inputs.get(batch_input.source_input)
            if source is None:
                raise ConfigError(
                    None,
                    "batch_input.source_input",
                    f"{batch_input.source_input!r} is not an input; inputs: {sorted(inputs)}",
                )
            if batch_input.target_name in inputs:
                raise ConfigError(
                    None,
                    "batch_input.target_name",
                    f"{batch_input.target_name!r} is generated, it cannot also be a request input",
                )
        self.max_dims  # noqa: B018 - parameters.max_shapes: refused at load, not at the first request
        self.call_bounds  # noqa: B018 - parameters.*_timeout_s: likewise
        self._validate_shapes()
        if any(t.allow_ragged_batch for t in self.inputs) and self.max_batch_size == 0:
            raise ConfigError(None, "input.allow_ragged_batch", "needs max_batch_size >= 1")
        optional = [t.name for t in self.inputs if t.optional]
        if optional and self.max_batch_size > 0:
            # Triton's ONNX Runtime backend refuses the same: a batch cannot feed ONNX Runtime an
            # input for some of its rows and the graph's initializer for the others.
            raise ConfigError(
                None,
                "input.optional",
                f"optional input {optional[0]!r} is not supported for models "
                "that support batching; set max_batch_size: 0",
            )
        if self.sequence_batching is not None:
            self._validate_sequences(inputs)
        if self.dynamic_batching is not None:
            if self.max_batch_size == 0:
                raise ConfigError(None, "dynamic_batching", "needs max_batch_size >= 1 (0 means no batch dim)")
            padding = self.dynamic_batching.padding
            if padding is not None and padding.mask_input is not None and padding.mask_input not in inputs:
                raise ConfigError(
                    None,
                    "dynamic_batching.padding.mask_input",
                    f"{padding.mask_input!r} is not an input; inputs: {sorted(inputs)}",
                )
            unknown = [n for n in self.dynamic_batching.separate_by_inputs if n not in inputs]
            if unknown:
                raise ConfigError(None, "dynamic_batching.separate_by_inputs", f"{unknown} are not inputs")
            too_big = [s for s in self.dynamic_batching.preferred_batch_size if s > self.max_batch_size]
            if too_big:
                raise ConfigError(
                    None,
                    "dynamic_batching.preferred_batch_size",
                    f"entries must be within 1..max_batch_size ({self.max_batch_size}), got {too_big}",
                )
        self._validate_bytes_inputs()
        model_kinds.check_kind(self)
        response_cache.check(
            self.name, self.extra, decoupled=self.decoupled, sequence=self.sequence_batching is not None
        )

    def _validate_shapes(self) -> None:
        """reshape and batch_output (common/repository/reshape.py)."""
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            for tensor in tensors:
                if tensor.reshape is not None:
                    check_reshape(kind, tensor.name, tensor.dims, tensor.reshape, self.max_batch_size)
        for batch_output in self.batch_outputs:
            batch_output.check(list(self.inputs_by_name), list(self.outputs_by_name))

    def _validate_sequences(self, inputs: Mapping[str, TensorConfig]) -> None:
        if self.dynamic_batching is not None:
            raise ConfigError(
                None,
                "sequence_batching",
                "a model has one scheduler: set dynamic_batching or sequence_batching, not both",
            )
        assert self.sequence_batching is not None  # (the caller checked)
        clash = [name for name in self.sequence_batching.generated_inputs if name in inputs]
        if clash:
            raise ConfigError(
                None,
                "sequence_batching",
                f"{clash} are written by the sequence batcher (control and state inputs); "
                "they cannot also be request inputs",
            )
        if self.kind == "ensemble":
            raise ConfigError(None, "sequence_batching", "an ensemble's sequence batching is not supported")

    # The kind's own (common/repository/kinds.py): onnx, python (model.py, run by the workers only) or
    # ensemble; Triton's model_transaction_policy.decoupled; an ensemble's steps in execution order.
    @functools.cached_property
    def kind(self) -> ModelKind:
        return model_kinds.kind_of(self.platform, self.extra.get("backend"))

    @functools.cached_property
    def decoupled(self) -> bool:
        return model_kinds.decoupled(self.extra)

    @functools.cached_property
    def ensemble_steps(self) -> tuple[EnsembleStep, ...]:
        return model_kinds.ensemble_steps(self.to_json()) if self.kind == "ensemble" else ()

    def _validate_bytes_inputs(self) -> None:
        """BYTES inputs reach the slot serialized, each request's elements after the previous one's:
        they stack by rows, but are never padded, concatenated as ragged, or compared by value."""
        if not self.bytes_inputs:
            return
        names = ", ".join(repr(n) for n in self.bytes_inputs)
        ragged = ", ".join(repr(n) for n in self.bytes_inputs if n in self.ragged_inputs)
        if ragged:
            raise ConfigError(
                None,
                "input.allow_ragged_batch",
                f"BYTES input(s) {ragged} cannot be ragged; ragged batching is for fixed-size inputs",
            )
        batching = self.dynamic_batching
        if batching is None:
            return
        if batching.padding is not None:
            raise ConfigError(
                None,
                "dynamic_batching.padding",
                f"BYTES input(s) {names} cannot be padded; padding is for models whose inputs are all fixed-size",
            )
        if batching.pad_to_preferred_batch_size:
            raise ConfigError(
                None,
                "dynamic_batching.pad_to_preferred_batch_size",
                f"BYTES input(s) {names} cannot be padded; padding is for models whose inputs are all fixed-size",
            )
        separating = ", ".join(repr(n) for n in batching.separate_by_inputs if n in self.bytes_inputs)
        if separating:
            raise ConfigError(
                None,
                "dynamic_batching.separate_by_inputs",
                f"BYTES input(s) {separating} cannot separate requests; name fixed-size inputs",
            )

    @classmethod
    def from_json(
        cls,
        name: str,
        doc: Mapping[str, Any],
        *,
        version: int,
        model_path: str,
        default_version: bool = True,
        source: str = "config.json",
    ) -> ModelConfig:
        """Build from Triton's JSON form (`data_type: "TYPE_FP32"`; KServe `datatype` also accepted);
        `source`: the file it came from, config.json or config.pbtxt (common/repository/pbtxt.py), named in errors."""
        with naming_model(name):
            check_fields(doc, where=source)
            if doc.get("name", name) != name:
                raise ConfigError(None, "name", f"{doc['name']!r} differs from the directory name")
            batching = doc.get("dynamic_batching")
            max_batch_size = as_int(doc.get("max_batch_size", 0), "max_batch_size")
            sequence_doc = doc.get("sequence_batching")
            return cls(
                name=name,
                max_batch_size=max_batch_size,
                inputs=tuple(TensorConfig.from_json(t) for t in doc.get("input", ())),
                outputs=tuple(TensorConfig.from_json(t) for t in doc.get("output", ())),
                dynamic_batching=None if batching is None else DynamicBatching.from_json(batching),
                version=version,
                model_path=model_path,
                platform=doc.get("platform") or ("" if doc.get("backend") == PYTHON_BACKEND else ONNX_PLATFORM),
                batch_inputs=tuple(BatchInput.from_json(b) for b in doc.get("batch_input", ())),
                batch_outputs=tuple(BatchOutput.from_json(b) for b in doc.get("batch_output", ())),
                extra={k: v for k, v in doc.items() if k not in _MODEL_KEYS},
                default_version=default_version,
                sequence_batching=None
                if sequence_doc is None
                else sequences.from_json(
                    sequence_doc, name, max_batch_size, _model_dir(model_path), _state_bounds(doc, max_batch_size)
                ),
            )

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "platform": self.platform,
            "max_batch_size": self.max_batch_size,
            "input": [t.to_json() for t in self.inputs],
            "output": [t.to_json() for t in self.outputs],
        }
        if self.dynamic_batching is not None:
            doc["dynamic_batching"] = self.dynamic_batching.to_json()
        if self.batch_inputs:
            doc["batch_input"] = [b.to_json() for b in self.batch_inputs]
        if self.batch_outputs:
            doc["batch_output"] = [b.to_json() for b in self.batch_outputs]
        if self.sequence_batching is not None:
            doc["sequence_batching"] = self.sequence_batching.to_json()
        return {**doc, **self.extra}

    @functools.cached_property
    def batch_output_sources(self) -> dict[str, str]:
        """batch_output targets -> their source input: outputs the gateway cuts per request by that input's shape."""
        return {target: b.source_input for b in self.batch_outputs for target in b.target_names}

    @functools.cached_property
    def warmup_samples(self) -> tuple[warmup.WarmupSample, ...]:
        """What each load runs before the version serves: Triton's model_warmup, and ringserve's `warmup: true`
        as one sample of zeros (common/repository/warmup.py)."""
        return warmup.samples_of(self)

    @functools.cached_property
    def ragged_inputs(self) -> frozenset[str]:
        return frozenset(t.name for t in self.inputs if t.allow_ragged_batch)

    @functools.cached_property
    def required_inputs(self) -> tuple[str, ...]:
        """The inputs every request must give (all but the optional ones), in config order."""
        return tuple(t.name for t in self.inputs if not t.optional)

    @functools.cached_property
    def bytes_inputs(self) -> tuple[str, ...]:
        """Names of the BYTES inputs (KServe BYTES, ONNX string); () for the usual all-fixed-size model."""
        return tuple(t.name for t in self.inputs if t.datatype == "BYTES")

    @functools.cached_property
    def max_dims(self) -> dict[str, tuple[int, ...]]:
        """Bounded inputs -> their largest dims, batch dim left out (-1: unbounded): `parameters.max_shapes`
        (common/repository/max_shapes.py); {} for the usual config."""
        text = parameter_text(self.extra.get("parameters"))
        if text is None:
            return {}
        dims = {t.name: t.dims for t in self.inputs}
        states = self.sequence_batching.states if self.sequence_batching is not None else ()
        dims.update({s.input_name: s.dims for s in states})  # (their bounds are the sessions' windows)
        bounds = read_max_shapes(text, dims, self.max_batch_size)
        return {name: bound for name, bound in bounds.items() if name in self.inputs_by_name}

    @functools.cached_property
    def call_bounds(self) -> dict[Hook, float]:
        """The bounds its `parameters` set on calls into its code (common/repository/call_bounds.py)."""
        return read_call_bounds(self.extra.get("parameters"))

    # Looked up per request on the gateway's hot path: computed once per config.
    @functools.cached_property
    def inputs_by_name(self) -> dict[str, TensorConfig]:
        return {t.name: t for t in self.inputs}

    @functools.cached_property
    def outputs_by_name(self) -> dict[str, TensorConfig]:
        return {t.name: t for t in self.outputs}

    @functools.cached_property
    def fixed_row_bytes(self) -> int:
        """Bytes one batch row takes in a slot beyond the request's own inputs: its outputs whose dims are
        all fixed, and a sequence model's control and state tensors (common/repository/sequences.py)."""
        outputs = sum(math.prod(t.dims) * t.np_dtype.itemsize for t in self.outputs if all(d > 0 for d in t.dims))
        return outputs + (self.sequence_batching.row_bytes() if self.sequence_batching is not None else 0)

    @functools.cached_property
    def generated_tensor_count(self) -> int:
        """Tensors of a batch beyond the requests' inputs and the outputs: batch_input and sequence tensors."""
        sequence = self.sequence_batching
        return len(self.batch_inputs) + (0 if sequence is None else len(sequence.controls) + 2 * len(sequence.states))

    def input(self, name: str) -> TensorConfig:
        """The input called `name`; KeyError if there is none."""
        return self.inputs_by_name[name]

    def output(self, name: str) -> TensorConfig:
        """The output called `name`; KeyError if there is none."""
        return self.outputs_by_name[name]

    @property
    def sequences(self) -> sequences.SequenceBatching:
        """sequence_batching, for code that runs only for a sequence model (ValueError for another)."""
        if self.sequence_batching is None:
            raise ValueError(f"model {self.name!r} has no sequence_batching")
        return self.sequence_batching

    @functools.cached_property
    def output_datatypes(self) -> dict[str, str]:
        """What the model computes, by name: its outputs' KServe datatypes, and a sequence model's state outputs'
        (which the worker writes into the slot beside the outputs, for the gateway to commit)."""
        states = self.sequence_batching.states if self.sequence_batching is not None else ()
        return {**{s.output_name: s.datatype for s in states}, **{t.name: t.datatype for t in self.outputs}}
